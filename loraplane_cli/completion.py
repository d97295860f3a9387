"""``loraplane completion``: the shell completion script click generates."""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.shell_completion import get_completion_class

from loraplane_cli.context import CliState, pass_state

SHELLS = ("bash", "zsh", "fish")
PROG = "loraplane"
COMPLETE_VAR = "_LORAPLANE_COMPLETE"


def completion_script(root: click.Command, shell: str) -> str:
    """What ``_LORAPLANE_COMPLETE=<shell>_source loraplane`` prints."""
    cls = get_completion_class(shell)
    if cls is None:
        raise click.BadParameter(f"no completion for {shell}")
    return cls(root, {}, PROG, COMPLETE_VAR).source()


def _login_shell() -> str:
    name = Path(os.environ.get("SHELL", "")).name
    return name if name in SHELLS else "bash"


@click.command("completion", short_help="Print the shell completion script.")
@click.argument("shell", type=click.Choice(SHELLS), required=False)
@pass_state
def completion_command(state: CliState, shell: str | None) -> None:
    """Print the completion script for SHELL (default: the one in $SHELL, else bash).

    \b
    bash: eval "$(loraplane completion bash)"          in ~/.bashrc
    zsh:  eval "$(loraplane completion zsh)"           in ~/.zshrc
    fish: loraplane completion fish > ~/.config/fish/completions/loraplane.fish
    """
    chosen = shell or _login_shell()
    script = completion_script(click.get_current_context().find_root().command, chosen)
    state.output.emit({"shell": chosen, "script": script},
                      lambda: click.echo(script, nl=False))
