"""``python -m inference_agent``: the same command as ``loraplane agent``."""

from __future__ import annotations

from inference_agent.command import agent_command


def main() -> None:
    agent_command.main(prog_name="python -m inference_agent")


if __name__ == "__main__":
    main()
