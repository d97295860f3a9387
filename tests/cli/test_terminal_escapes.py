"""Issue 35, Medium 13: what the server sends never reaches the terminal as control codes.

A token name such as ``"\\x1b]0;owned\\x07\\x1b[2J"`` (stored before the registry refused
such names, or sent by a registry one does not trust) is printed by ``token list`` and
``history`` as visible escapes; rich alone passes ESC through.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner

from loraplane.api import AliasHistory, TokenList
from loraplane.api.aliases import AliasMoveOut
from loraplane.api.tokens import TokenOut
from loraplane_cli.client import CliError
from loraplane_cli.context import CliState
from loraplane_cli.output import Output, terminal_safe
from loraplane_cli.tokens import list_command
from loraplane_cli.versions import history_command

EVIL = "ops\x1b]0;owned\x07\x1b[2J\x9b31m\u202eexe.txt\u2066\x00\x7f\u2028"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\x00", "\x7f", "\u2028")
NOW = datetime(2025, 1, 1, tzinfo=UTC)


class _Client:
    def list_tokens(self, include_revoked: bool = False) -> TokenList:
        return TokenList(tokens=[TokenOut(id=1, name=EVIL, role="admin", tenant=None,
                                          prefix="lp_abc", created_at=NOW, revoked_at=None)])

    def alias_history(self, name: str, alias: str, limit: int = 20) -> AliasHistory:
        move = AliasMoveOut(revision=1, action="promote", from_version=None, to_version=1,
                            actor=EVIL, created_at=NOW)
        return AliasHistory(adapter=name, alias=alias, moves=[move])


def _run(capsys: pytest.CaptureFixture[str], command: Any, args: list[str],
         json_mode: bool = False) -> str:
    # Output's consoles write to the sys.stdout of their making: capsys', not CliRunner's.
    state = CliState(registry="http://127.0.0.1:1", output=Output(json_mode=json_mode))
    state._client = _Client()  # type: ignore[assignment]
    result = CliRunner().invoke(command, args, obj=state, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output + capsys.readouterr().out


def _assert_escaped(shown: str) -> None:
    for char in RAW:
        assert char not in shown, (char, shown)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202eexe.txt\\u2066\\x00\\x7f\\u2028" in shown


def test_token_list_escapes_control_characters(capsys: pytest.CaptureFixture[str]) -> None:
    _assert_escaped(_run(capsys, list_command, []))


def test_history_escapes_control_characters(capsys: pytest.CaptureFixture[str]) -> None:
    _assert_escaped(_run(capsys, history_command, ["bot"]))


def test_json_mode_keeps_the_value_exact_and_escaped_by_json(
        capsys: pytest.CaptureFixture[str]) -> None:
    shown = _run(capsys, list_command, [], json_mode=True)
    assert "\x1b" not in shown and "\u202e" not in shown
    assert json.loads(shown)["tokens"][0]["name"] == EVIL


def test_every_output_path_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    out = Output()
    out.line(f"deleted {EVIL}", markup=False)
    out.line(f"[green]published[/] {EVIL}")
    out.fields([("name", EVIL)])
    out.table(("name",), [(EVIL,)], title=EVIL)
    out.info(EVIL)
    out.warn(EVIL)
    out.error(CliError(EVIL, code="x\x1b", hint=EVIL))
    captured = capsys.readouterr()
    for shown in (captured.out, captured.err):
        for char in RAW:
            assert char not in shown, (char, shown)


def test_terminal_safe_keeps_ordinary_text() -> None:
    assert terminal_safe("déploiement ⚙ 部署 [x]") == "déploiement ⚙ 部署 [x]"
    assert terminal_safe("a\nb\tc") == "a\\x0ab\\x09c"
    assert terminal_safe("a\nb\tc", newlines=True) == "a\nb\tc"
    assert terminal_safe("\U000e0001") == "\\U000e0001"
