"""Every ``loraplane ...`` command the README and docs/ show is one the CLI takes.

A command line in a shell block is parsed whole by the real click commands, as
``make_context`` does at each level (nothing invoked): each subcommand, option, choice
and required argument must fit. A command in running text (`` `loraplane rollout NAME` ``)
may leave arguments out, so only its subcommands and ``--options`` are checked there.
Placeholders are plain words (``NAME``, ``"$AGENT_TOKEN"``), and in the text ``...``
stands for whatever follows; an environment assignment before the command
(``LORAPLANE_ADMIN_TOKEN=... loraplane ...``) is dropped.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from loraplane_cli.main import cli
from tests.docs.doc_blocks import ROOT, command_lines, doc_files, shell_blocks

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_INLINE = re.compile(r"(?<!`)`(loraplane [^`]+)`(?!`)")


def _words(line: str) -> list[str] | None:
    """The arguments after ``loraplane`` on a command line, or None for another command."""
    words = shlex.split(line)
    while words and _ASSIGNMENT.match(words[0]):
        words.pop(0)
    return words[1:] if words and words[0] == "loraplane" else None


def _block_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in doc_files():
        for block in shell_blocks(path):
            for line in command_lines(block.code):
                words = _words(line)
                if words is not None:
                    found.append((f"{block.where()}: {line}", words))
    return found


def _inline_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in doc_files():
        for match in _INLINE.finditer(path.read_text()):
            text = " ".join(match[1].split())
            found.append((f"{path.relative_to(ROOT)}: {text}", text.split()[1:]))
    return found


def parse(words: list[str]) -> click.Context:
    """Parse ``loraplane WORDS`` down to its last subcommand, as ``make_context`` does
    at each level; return that context (nothing is invoked)."""
    command: click.Command = cli
    name, args, parent = "loraplane", list(words), None
    while True:
        ctx = command.context_class(command, info_name=name, parent=parent)
        with ctx.scope(cleanup=False):
            # click.Command's own parsing: the rest, subcommand first, stays in one list.
            rest = click.Command.parse_args(command, ctx, args)
        if not isinstance(command, click.Group) or not rest:
            return ctx
        found, sub, args = command.resolve_command(ctx, rest)
        assert found is not None and sub is not None
        command, name, parent = sub, found, ctx


def _options(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)}


def check_names(words: list[str]) -> None:
    """The subcommands named exist, and every ``--option`` belongs to one on the way."""
    command: click.Command = cli
    known = _options(cli)
    for word in words:
        if word == "...":
            return
        if word.startswith("-"):
            assert word.split("=", 1)[0] in known | {"--help", "-h"}, f"no option {word}"
        elif isinstance(command, click.Group):
            sub = command.get_command(click.Context(command), word)
            assert sub is not None, f"no command {word!r} in {command.name}"
            command = sub
            known |= _options(command)


def test_the_docs_show_commands() -> None:
    assert len(_block_commands()) > 20
    assert len(_inline_commands()) > 10


def _make_local_paths(words: list[str], folder: Path) -> None:
    """The files a command names relative to the reader's folder (``./my-adapter/``):
    made in ``folder``, since click checks they exist."""
    for word in words:
        if word.startswith("./") or word.endswith(("/", ".tar.gz", ".zip")):
            path = folder / word
            if word.endswith("/"):
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()


@pytest.mark.parametrize(("where", "words"), _block_commands(), ids=lambda v: str(v)[:90])
def test_a_command_line_parses(where: str, words: list[str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    _make_local_paths(words, tmp_path)
    monkeypatch.chdir(tmp_path)
    try:
        parse(words)
    except click.ClickException as exc:
        pytest.fail(f"{where}\n{type(exc).__name__}: {exc.format_message()}")


@pytest.mark.parametrize(("where", "words"), _inline_commands(), ids=lambda v: str(v)[:90])
def test_a_command_in_the_text_exists(where: str, words: list[str]) -> None:
    try:
        check_names(words)
    except AssertionError as exc:
        pytest.fail(f"{where}: {exc}")


@pytest.mark.parametrize("words", [["push", "--no-such-option", "x", "y"],
                                   ["adapters", "creat", "x"], ["promote", "support-bot"]])
def test_a_wrong_command_fails_to_parse(words: list[str]) -> None:
    with pytest.raises(click.ClickException):
        parse(words)


def test_an_unknown_option_in_the_text_is_caught() -> None:
    with pytest.raises(AssertionError, match="--replica"):
        check_names(["adapters", "place", "NAME", "--replica", "2"])

