"""CLI behaviour that needs no registry: token resolution, argument checks, formatting."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from loraplane_cli.client import CliError
from loraplane_cli.context import CliState, is_loopback_url
from loraplane_cli.events import event_line
from loraplane_cli.main import cli
from loraplane_cli.output import Output, human_size, short_digest
from loraplane_cli.push import collect_files, parse_alias_options
from registry_service.settings import DEFAULT_DATA_DIR


def state(registry: str, *, token: str | None = None, data_dir: Path | None = None) -> CliState:
    return CliState(registry=registry, output=Output(), token=token, data_dir=data_dir)


@pytest.mark.parametrize(("url", "loopback"), [
    ("http://127.0.0.1:8080", True), ("http://127.9.0.1", True), ("http://localhost:1", True),
    ("http://[::1]:8080/", True), ("https://registry.example.com", False),
    ("http://10.0.0.1:8080", False), ("http://localhost.example.com", False),
])
def test_loopback_detection(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_the_admin_token_file_is_read_only_where_it_belongs(tmp_path: Path) -> None:
    (tmp_path / "admin-token").write_text("lp_secret\n")
    assert state("http://127.0.0.1:8080", data_dir=tmp_path).resolve_token() == "lp_secret"
    # Named on purpose: sent even to a remote registry.
    assert state("https://reg.example.com", data_dir=tmp_path).resolve_token() == "lp_secret"
    assert state("http://127.0.0.1:8080", token="lp_given",
                 data_dir=tmp_path).resolve_token() == "lp_given"
    # The default data dir's admin secret never leaves for another host.
    remote = state("https://reg.example.com")
    assert remote.effective_data_dir == DEFAULT_DATA_DIR
    assert remote.resolve_token() is None
    assert state("http://127.0.0.1:8080", data_dir=tmp_path / "absent").resolve_token() is None


def test_an_unreadable_token_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "admin-token").mkdir()
    with pytest.raises(CliError, match="cannot read the admin token file") as caught:
        state("http://127.0.0.1:8080", data_dir=tmp_path).resolve_token()
    assert caught.value.hint is not None and "LORAPLANE_TOKEN" in caught.value.hint


def test_alias_options_accept_repeats_and_comma_lists() -> None:
    assert parse_alias_options((), False) == []  # storing a version does not serve it
    assert parse_alias_options(("canary, live", "live", "beta"), False) == [
        "canary", "live", "beta"]
    assert parse_alias_options((), True) == []
    with pytest.raises(click.UsageError):
        parse_alias_options(("live",), True)


def test_collect_files_sends_the_two_adapter_files_or_one_archive(tmp_path: Path) -> None:
    for name in ("adapter_config.json", "adapter_model.safetensors", "README.md"):
        (tmp_path / name).write_text(name)
    parts = collect_files(tmp_path)
    assert [(p.filename, p.size) for p in parts] == [
        ("adapter_config.json", 19), ("adapter_model.safetensors", 25)]
    archive = tmp_path / "Adapter.TGZ"
    archive.write_bytes(b"\x1f\x8b")
    [part] = collect_files(archive)
    assert (part.filename, part.content_type) == ("Adapter.TGZ", "application/gzip")
    with pytest.raises(CliError, match="neither an adapter folder nor an archive") as caught:
        collect_files(tmp_path / "README.md")
    assert caught.value.exit_code == 2
    archive.unlink()
    (tmp_path / "adapter_model.safetensors").unlink()
    with pytest.raises(CliError, match=r"adapter_model\.safetensors is missing"):
        collect_files(tmp_path)


def test_a_folder_is_judged_by_the_archive_rules(tmp_path: Path) -> None:
    """Tokenizer files are dropped as README.md is, anything else is refused, and pickle
    weights get a hint to re-save them, as the registry does for an archive's members."""
    for name in ("adapter_config.json", "adapter_model.safetensors",
                 "tokenizer_config.json", "special_tokens_map.json"):
        (tmp_path / name).write_text(name)
    assert [p.filename for p in collect_files(tmp_path)] == [
        "adapter_config.json", "adapter_model.safetensors"]
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CliError, match=r"unexpected files notes\.txt") as caught:
        collect_files(tmp_path)
    assert (caught.value.code, caught.value.exit_code) == ("unknown_file", 2)
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "adapter_model.safetensors").rename(tmp_path / "adapter_model.bin")
    with pytest.raises(CliError, match=r"save_pretrained\(path, safe_serialization=True\)"):
        collect_files(tmp_path)


def test_local_refusals_exit_2_with_the_reason_on_stderr(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["--registry", "http://127.0.0.1:9", "adapters", "delete", "x"])
    assert result.exit_code == 2
    assert "add --yes to confirm" in result.stderr and result.stdout == ""
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (tmp_path / name).write_text(name)
    result = runner.invoke(cli, ["push", "x", str(tmp_path), "--alias", "a", "--no-alias"])
    assert result.exit_code == 2
    assert "--no-alias and --alias cannot be used together" in result.stderr


def test_event_lines_describe_every_event_type() -> None:
    base = {"seq": 7, "time": "2025-01-02T03:04:05+00:00", "tenant": "acme", "adapter": "bot"}
    updated = event_line({**base, "type": "adapter_updated", "alias": "live",
                          "previous_version": 2, "version": None, "action": "delete",
                          "revision": 5})
    assert " ".join(updated.split()).endswith(
        "adapter_updated acme/bot live: 2 -> removed (delete, revision 5)")
    assert event_line({**base, "type": "version_published",
                       "target": {"version": 3, "digest": "ab" * 32}}).endswith(
        "version 3 (abababababab)")
    assert event_line({**base, "type": "adapter_deleted"}).endswith("adapter deleted")
    assert event_line({**base, "type": "placement_changed", "replicas": 2}).endswith(
        "placement: 2 replica(s)")
    assert event_line({**base, "type": "placement_changed", "replicas": None}).endswith(
        "placement: none")
    assert event_line({**base, "type": "route_changed", "kind": "customer", "key": "c1",
                       "rule": {"adapter": "bot", "alias": "canary"}}).endswith(
        "route customer/c1 -> bot@canary")
    assert event_line({**base, "type": "route_changed", "kind": "task", "key": "t",
                       "rule": None}).endswith("route task/t removed")
    assert event_line({**base, "type": "something_new"}).startswith("#7  ")


def test_sizes_and_digests_are_short_for_tables() -> None:
    assert [human_size(n) for n in (0, 1023, 1024, 5 * 1024**2 + 1, 3 * 1024**4)] == [
        "0 B", "1023 B", "1.0 KiB", "5.0 MiB", "3072.0 GiB"]
    assert short_digest("sha256:" + "f" * 64) == "sha256:ffffffffffff"
    assert short_digest(None) == "-"


def test_piped_output_keeps_long_lines_whole(capsys: pytest.CaptureFixture[str]) -> None:
    out = Output()
    out.line("x" * 400, markup=False)
    out.fields([("digest", "f" * 300)])
    out.error(CliError("e" * 300, code="boom"))
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["x" * 400, "digest  " + "f" * 300]
    assert captured.err.splitlines() == ["error: " + "e" * 300 + " [boom]"]


def test_json_mode_prints_the_error_document_on_stdout(
        capsys: pytest.CaptureFixture[str]) -> None:
    Output(json_mode=True).error(CliError("gone", code="not_found", status=404))
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"error": {"code": "not_found", "message": "gone",
                                                  "detail": {}, "status": 404}}
    assert captured.err == "error: gone [not_found]\n"
