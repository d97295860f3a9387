"""A newcomer's first hour (issue 36) against a real ``loraplane registry serve``: finding
the token, ``login``/``whoami`` and profiles, ``--json`` after the command, the alias
commands, the hints of the README's examples, a quiet start and a taken port."""

from __future__ import annotations

import socket
import stat
import subprocess
from pathlib import Path

import pytest

from devharness.adapters import make_adapter
from loraplane.client import RegistryClient
from loraplane.netutil import free_ports
from tests.cli.conftest import CLI, START_TIMEOUT_S, Result, ServedRegistry, clean_env

pytestmark = pytest.mark.e2e


def admin_token(served: ServedRegistry) -> str:
    return (served.data_dir / "admin-token").read_text().strip()


def run_as_newcomer(served: ServedRegistry, home: Path, *args: str, stdin: str = "",
                    expect: int = 0, **env: str) -> Result:
    """``loraplane ARGS`` with only LORAPLANE_REGISTRY set: no token, no data dir, and a
    home of its own (no ~/.loraplane, no ~/.config/loraplane)."""
    done = subprocess.run(
        [*CLI, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False,
        env=clean_env(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
                      LORAPLANE_CONFIG=str(home / ".config" / "loraplane" / "config.toml"),
                      LORAPLANE_REGISTRY=served.url, **env))
    result = Result(args, done.returncode, done.stdout, done.stderr)
    assert result.returncode == expect, str(result)
    assert "Traceback" not in result.stderr, str(result)
    return result


def test_a_missing_token_says_where_to_find_one(served: ServedRegistry, tmp_path: Path) -> None:
    refused = run_as_newcomer(served, tmp_path, "adapters", "list", expect=1)
    assert "a bearer token is required" in refused.stderr
    for words in ("loraplane login", "--data-dir", "LORAPLANE_DATA_DIR"):
        assert words in refused.stderr, refused.stderr
    # Named, the data dir's admin token is found.
    run_as_newcomer(served, tmp_path, "--data-dir", str(served.data_dir), "adapters", "list")


def test_login_checks_and_saves_the_token_then_whoami_uses_it(
        served: ServedRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = admin_token(served)
    config = tmp_path / ".config" / "loraplane" / "config.toml"
    wrong = run_as_newcomer(served, tmp_path, "login", stdin="lp_wrong\n", expect=1)
    assert "unknown or revoked" in wrong.stderr and not config.exists()

    saved = run_as_newcomer(served, tmp_path, "login", stdin=secret + "\n")
    assert secret not in saved.stdout + saved.stderr
    assert "bootstrap-admin (admin, global)" in saved.stdout
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    me = run_as_newcomer(served, tmp_path, "whoami", "--json").json()
    assert (me["registry"], me["profile"]) == (served.url, "default")
    assert me["token_source"] == f"profile default of {config}"
    assert (me["token"]["name"], me["token"]["role"], me["token"]["tenant"]) == (
        "bootstrap-admin", "admin", None)

    reader = run_as_newcomer(served, tmp_path, "token", "create", "viewer", "--role", "reader",
                             "--tenant", "acme").stdout.strip()
    run_as_newcomer(served, tmp_path, "login", "--profile", "ro", "--token", reader)
    as_reader = run_as_newcomer(served, tmp_path, "--profile", "ro", "whoami").stdout
    assert "viewer" in as_reader and "reader" in as_reader and "acme" in as_reader
    from_env = run_as_newcomer(served, tmp_path, "whoami", "--json", LORAPLANE_PROFILE="ro")
    assert from_env.json()["token"]["name"] == "viewer"

    # The Python client reads the same file.
    monkeypatch.setenv("LORAPLANE_CONFIG", str(config))
    for name in ("LORAPLANE_REGISTRY", "LORAPLANE_TOKEN", "LORAPLANE_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with RegistryClient() as client:
        assert client.whoami().name == "bootstrap-admin"


def test_json_after_the_command_and_the_alias_commands(served: ServedRegistry,
                                                      tmp_path: Path) -> None:
    served.run("adapters", "create", "first-hour", "--base-model", "tiny-llama",
               "--tenant", "acme")
    served.run("push", "first-hour", str(make_adapter(tmp_path / "v1", seed=1)))
    versions = served.run("versions", "first-hour", "--json").json()
    assert [v["version"] for v in versions["versions"]] == [1]

    moved = served.run("alias", "set", "first-hour", "canary", "1", "--json").json()
    assert (moved["alias"], moved["version"]) == ("canary", 1)
    stale = served.run("alias", "set", "first-hour", "canary", "1", "--expect-revision", "0",
                       expect=1)
    assert "conflict" in stale.stderr or "revision" in stale.stderr, str(stale)
    listed = served.run("alias", "list", "first-hour", "--json").json()
    canary = next(a for a in listed["aliases"] if a["alias"] == "canary")
    assert (canary["version"], canary["revision"]) == (1, 1)
    table = served.run("alias", "list", "first-hour", COLUMNS="80").stdout
    assert "moved at" in table and "canary" in table
    deleted = served.run("alias", "delete", "first-hour", "canary", "--json").json()
    assert deleted["version"] is None


def test_the_readme_placement_example_hints_at_the_tenant(served: ServedRegistry) -> None:
    refused = served.run("adapters", "create", "placed-bot", "--base-model", "tiny-llama",
                         "--replicas", "2", expect=1)
    assert "tenant_required" in refused.stderr
    assert "--tenant NAME" in refused.stderr, refused.stderr
    served.run("adapters", "create", "placed-bot", "--base-model", "tiny-llama",
               "--replicas", "2", "--tenant", "acme")


def test_an_invalid_name_is_explained_in_words(served: ServedRegistry) -> None:
    refused = served.run("adapters", "create", "Support_Bot", "--base-model", "tiny-llama",
                         "--tenant", "acme", expect=1)
    assert "lowercase letters, digits and hyphens" in refused.stderr, refused.stderr
    assert "[a-z0-9]" not in refused.stderr


def test_the_first_start_logs_no_migration_steps(served: ServedRegistry) -> None:
    log = served.log()
    assert "registry ready" in log
    assert "alembic" not in log and "Running upgrade" not in log, log
    # A data dir of its own: the banner says how the CLI finds its admin token.
    assert f"--data-dir {served.data_dir}" in log, log


def test_a_taken_port_fails_before_the_registry_says_it_is_ready(tmp_path: Path) -> None:
    port, nats_port = free_ports(2)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        done = subprocess.run(
            [*CLI, "registry", "serve", "--port", str(port), "--data-dir",
             str(tmp_path / "data")],
            capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False,
            env=clean_env(LORAPLANE_EMBEDDED_NATS_PORT=str(nats_port)))
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in output
    assert "registry ready" not in output and "Traceback" not in output
