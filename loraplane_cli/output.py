"""What the CLI prints: rich tables for people, plain JSON on stdout for scripts.

Results go to stdout and everything else (errors, warnings, progress) to stderr, so
``loraplane ... --json | jq`` always sees a single JSON document (or JSON Lines for
streams such as ``events --follow``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from loraplane.api.text import is_unsafe
from loraplane_cli.client import CliError

# A pipe has no width; rich would wrap at 80 columns and break lines that scripts grep.
_PIPE_WIDTH = 200
# What box.SIMPLE_HEAD adds to each column without its edge padding: a space either side.
_CELL_CHROME = 3


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else _PIPE_WIDTH
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def terminal_safe(text: str, *, newlines: bool = False) -> str:
    """``text`` with every character that could steer a terminal written as an escape.

    Control characters (ESC starts the sequences that move the cursor, retitle the
    window or rewrite the screen), bidi overrides and the other format characters
    become ``\\x1b``, ``\\u202e``, ... so a name from the server shows what it holds.
    With ``newlines``, line breaks and tabs are kept (a message of several lines).
    """
    if text.isascii() and text.isprintable():
        return text
    kept = "\n\t" if newlines else ""
    return "".join(
        _escaped(char) if is_unsafe(char) and char not in kept else char for char in text
    )


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _safe(text: str) -> str:
    return terminal_safe(text, newlines=True)


def human_size(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def short_time(value: Any) -> str:
    """A timestamp from the server (parsed, or ISO text) as local ``YYYY-MM-DD HH:MM:SS``."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return value
    else:
        return "-"
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone()
    return parsed.strftime("%Y-%m-%d %H:%M:%S")


def short_digest(digest: Any) -> str:
    if not isinstance(digest, str):
        return "-"
    algo, _, hexdigest = digest.rpartition(":")
    return f"{algo}:{hexdigest[:12]}" if algo else hexdigest[:12]


def cell(value: Any) -> str:
    """One value as table or field text, escaped for the terminal (:func:`terminal_safe`)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value) or "-"
    return terminal_safe(str(value))


class Output:
    """The one writer every command uses, so ``--json`` means the same everywhere."""

    def __init__(self, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        self.out = _console(stderr=False)
        self.err = _console(stderr=True)

    @property
    def interactive(self) -> bool:
        """Whether live progress may be drawn: never for scripts or into a pipe."""
        return not self.json_mode and self.err.is_terminal

    def emit(self, data: Any, render: Callable[[], None]) -> None:
        """``data`` as JSON in ``--json`` mode; otherwise whatever ``render`` prints."""
        if self.json_mode:
            self.json(data)
        else:
            render()

    def json(self, data: Any) -> None:
        if isinstance(data, BaseModel):
            # The registry's own JSON: the models are its wire contract.
            data = data.model_dump(mode="json")
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()

    def json_line(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, separators=(",", ":"), default=str) + "\n")
        sys.stdout.flush()

    # Lines are never wrapped by us (soft_wrap): a terminal wraps them itself, and a pipe
    # must get each line whole, however long. Every text is made terminal_safe: most
    # hold names or messages from the server.
    def line(self, text: str = "", *, markup: bool = True) -> None:
        text = terminal_safe(text, newlines=True)
        self.out.print(text if markup else escape(text), soft_wrap=True)

    def info(self, text: str) -> None:
        """A status line for people; kept off stdout so it never mixes into results."""
        if not self.json_mode:
            self.err.print(terminal_safe(text, newlines=True), soft_wrap=True)

    def warn(self, text: str) -> None:
        self.err.print(f"[yellow]warning:[/] {escape(_safe(text))}", soft_wrap=True)

    def error(self, exc: CliError) -> None:
        code = f" [dim]\\[{escape(_safe(exc.code))}][/]" if exc.code != "cli_error" else ""
        self.err.print(f"[bold red]error:[/] {escape(_safe(exc.message))}{code}",
                       soft_wrap=True)
        if exc.hint:
            self.err.print(f"[dim]hint:[/] {escape(_safe(exc.hint))}", soft_wrap=True)
        if self.json_mode:
            self.json(exc.as_json())

    def table(
        self,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        *,
        title: str | None = None,
        empty: str = "nothing to show",
        whole: Collection[str] = (),
        optional: Sequence[str] = (),
    ) -> None:
        """Rows under ``columns``, readable at 80 columns: no header is split, the
        ``whole`` columns (digests, times, numbers) never wrap, the others wrap, and the
        ``optional`` ones are left out, in that order, while the rest would not fit."""
        materialized = [[cell(v) for v in row] for row in rows]
        if not materialized:
            self.out.print(f"[dim]{escape(empty)}[/]")
            return
        shown = fitting_columns(columns, materialized, whole, optional, self.out.width)
        table = Table(title=terminal_safe(title) if title is not None else None,
                      title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                      show_edge=False, pad_edge=False)
        for index in shown:
            name = columns[index]
            # Fold rather than truncate: a cut-off id is worse than a tall row.
            table.add_column(name, overflow="fold", no_wrap=name in whole,
                             min_width=_longest_word(name))
        for row in materialized:
            table.add_row(*(escape(row[index]) for index in shown))
        self.out.print(table)

    def fields(self, pairs: Sequence[tuple[str, Any]]) -> None:
        """A key/value block for one object (``adapters show``, a pushed version)."""
        width = max((len(k) for k, _ in pairs), default=0)
        for key, value in pairs:
            self.out.print(
                f"[bold]{escape(key.ljust(width))}[/]  {escape(cell(value))}", soft_wrap=True
            )


def _longest_word(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


def fitting_columns(columns: Sequence[str], rows: list[list[str]], whole: Collection[str],
                    optional: Sequence[str], width: int) -> list[int]:
    """The indexes of the columns to show: without the ``optional`` ones (first named,
    first left out) while the table's narrowest form is wider than ``width``."""
    def narrowest(index: int) -> int:
        texts = [columns[index], *(row[index] for row in rows)]
        if columns[index] in whole:
            return max(len(text) for text in texts)
        return max(_longest_word(text) for text in texts)

    shown = list(range(len(columns)))
    dropped = iter(optional)
    # Each column costs its text and the padding either side (box.SIMPLE_HEAD).
    while sum(narrowest(i) + _CELL_CHROME for i in shown) > width:
        name = next(dropped, None)
        if name is None:
            break
        shown = [i for i in shown if columns[i] != name]
    return shown
