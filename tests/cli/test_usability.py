"""A newcomer's first hour with the CLI (issue 36), without a registry: flags, help,
tables at 80 columns, hints, completion."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from loraplane.api import VersionOut
from loraplane.client import Unauthorized
from loraplane.client.errors import BadRequest
from loraplane.events import ServedVersion
from loraplane_cli.client import cli_error
from loraplane_cli.completion import completion_script
from loraplane_cli.events import event_line
from loraplane_cli.fleet import _failures
from loraplane_cli.main import cli
from loraplane_cli.output import Output
from loraplane_cli.versions import _render_versions

# Nothing listens here: every command that reaches the registry fails at once.
NOWHERE = "http://127.0.0.1:9"


def commands(group: click.Group, prefix: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))


def invoke(*args: str) -> click.testing.Result:
    env = {"LORAPLANE_CONFIG": "/nonexistent/loraplane.toml", "LORAPLANE_TOKEN": "",
           "COLUMNS": "80"}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_every_command_takes_json_after_its_name() -> None:
    every = list(commands(cli))
    assert len(every) > 25
    for path, command in every:
        assert any("--json" in p.opts for p in command.params), path


@pytest.mark.parametrize("args", [
    ("versions", "support-bot", "--json"),
    ("alias", "list", "support-bot", "--json"),
    ("adapters", "show", "support-bot", "--json"),
])
def test_json_after_the_command_prints_the_error_as_json(args: tuple[str, ...]) -> None:
    result = invoke("--registry", NOWHERE, *args)
    assert result.exit_code == 1, result.output
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "unreachable"


def test_help_says_what_each_option_is_for() -> None:
    history = invoke("history", "--help").stdout
    assert "The alias to move" not in history
    assert "The alias whose moves to show" in history
    alias = invoke("alias", "--help").stdout
    assert "``" not in alias
    for sub in ("list", "set", "delete"):
        assert f"\n  {sub} " in alias, alias


def version(number: int, notes: str = "") -> VersionOut:
    return VersionOut(adapter="support-bot", version=number, digest="5f" * 32,
                      base_model="meta-llama/Llama-3.1-8B-Instruct", rank=16, alpha=32.0,
                      target_modules=["q_proj"], files=[], total_size=35_000_000,
                      uploader="bootstrap-admin", notes=notes,
                      created_at=datetime(2026, 11, 29, 6, 0, tzinfo=UTC))


def test_the_versions_table_reads_at_80_columns(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    out = Output()
    assert out.out.width == 80
    items = [version(12, "fine-tuned on the march tickets"), version(11)]
    _render_versions(out, "support-bot", items, {12: ["canary", "live"]})
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    header = next(line for line in lines if line.startswith("version"))
    for name in ("version", "aliases", "digest", "size", "created", "notes"):
        assert f" {name} " in f" {header} ", header
    # The digest: its first 12 hex characters, on one line.
    assert sum("5f5f5f5f5f5f" in line for line in lines) == 2
    assert not any("5f5f5f5f5f5f5" in line for line in lines)


def test_event_lines_line_up_and_name_no_empty_adapter() -> None:
    base = {"time": "2026-11-29T06:00:00+00:00", "tenant": "acme"}
    lines = [
        event_line({**base, "seq": 9, "type": "adapter_created", "adapter": "bot"}),
        event_line({**base, "seq": 10, "type": "version_published", "adapter": "bot",
                    "target": {"version": 1, "digest": "ab" * 32}}),
        event_line({**base, "seq": 11, "type": "token_issued", "adapter": ""}),
    ]
    assert "acme/ " not in lines[2] + " " and not lines[2].endswith("/")
    starts = [[line.index(part) for part in ("2026", "acme")] for line in lines]
    assert starts[0] == starts[1] == starts[2], lines


def test_a_failure_shows_its_reason_not_only_its_code() -> None:
    failed = ServedVersion(adapter="bot", version=3, alias=None, state="failed",
                           code="load_failed",
                           reason="vLLM refused the adapter: rank 64 > max_lora_rank 16")
    assert _failures([failed]) == (
        "bot@3: load_failed: vLLM refused the adapter: rank 64 > max_lora_rank 16")


def test_a_missing_token_names_login_and_the_data_dir(tmp_path: Path) -> None:
    refused = Unauthorized("a bearer token is required", status=401, code="missing_token")
    hint = cli_error(refused, has_token=False,
                     missing_token_file=tmp_path / "admin-token").hint or ""
    for words in ("loraplane login", "--token", "LORAPLANE_TOKEN", "--data-dir",
                  "LORAPLANE_DATA_DIR", str(tmp_path / "admin-token")):
        assert words in hint, hint
    assert "--data-dir" not in (cli_error(refused, has_token=False).hint or "")


def test_tenant_required_says_to_add_tenant() -> None:
    refused = BadRequest("a global token must name the tenant", status=400,
                         code="tenant_required")
    assert "--tenant NAME" in (cli_error(refused, has_token=True).hint or "")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_script_click_generates(shell: str) -> None:
    result = invoke("completion", shell)
    assert result.exit_code == 0, result.output
    assert result.stdout == completion_script(cli, shell)
    assert "_LORAPLANE_COMPLETE" in result.stdout and "loraplane" in result.stdout


def test_the_bash_completion_script_is_valid_bash(tmp_path: Path) -> None:
    script = tmp_path / "loraplane.bash"
    script.write_text(invoke("completion", "bash").stdout)
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                             check=False)
    assert checked.returncode == 0, checked.stderr
    assert "complete -o nosort -F _loraplane_completion loraplane" in script.read_text()
