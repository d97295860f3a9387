"""``python -m inference_agent``: the same as ``loraplane agent``."""

from __future__ import annotations

from loraplane.cli.agent import agent_command


def main() -> None:
    agent_command.main(prog_name="python -m inference_agent")


if __name__ == "__main__":
    main()
