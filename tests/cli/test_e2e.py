"""End to end: the real ``loraplane`` command against a real ``loraplane registry serve``.

The tests of this module share one registry and run in file order; each uses its own
adapter names, so only the event log is shared (and read relative to its current end).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import queue
import select
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devharness.adapters import make_adapter, pack_adapter
from devharness.openai_client import RETRY_OVER_HTTP
from devharness.waiting import eventually
from loraplane.netutil import free_port
from registry_service.db.migrate import head_revision
from tests.cli.conftest import CLI, INTERRUPTIBLE_CLI, ServedRegistry, clean_env

pytestmark = pytest.mark.e2e


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def event_end(served: ServedRegistry) -> int:
    return int(served.run("--json", "events", "--after", "0", "--limit", "100000")
               .json()["next_after"])


def test_push_promote_rollback_and_history(served: ServedRegistry, tmp_path: Path) -> None:
    created = served.run("adapters", "create", "support-bot", "--base-model", "tiny-llama",
                         "--tenant", "acme", "--description", "help desk")
    assert "created adapter support-bot (tenant acme, base model tiny-llama)" in created.stdout
    shown = served.run("--json", "adapters", "show", "support-bot").json()
    assert (shown["name"], shown["tenant"], shown["description"]) == ("support-bot", "acme",
                                                                      "help desk")
    start = event_end(served)
    first = make_adapter(tmp_path / "v1", seed=1)
    second = pack_adapter(make_adapter(tmp_path / "v2", seed=2, rank=4),
                          tmp_path / "v2.tar.gz")

    pushed = served.run("--json", "push", "support-bot", str(first), "--alias", "live",
                        "--notes", "first cut")
    assert pushed.stderr == ""  # no progress bar without a terminal
    body = pushed.json()
    assert (body["version"], body["created"], body["notes"]) == (1, True, "first cut")
    assert {f["name"]: (f["size"], f["sha256"]) for f in body["files"]} == {
        name: ((first / name).stat().st_size, sha256(first / name))
        for name in ("adapter_config.json", "adapter_model.safetensors")}
    assert [(a["alias"], a["previous_version"], a["version"], a["changed"])
            for a in body["aliases"]] == [("live", None, 1, True)]

    again = served.run("push", "support-bot", str(first), "--alias", "live")
    assert "support-bot version 1 already holds these files: identical re-upload" in again.stdout
    assert "live: unchanged at 1 (revision 1)" in again.stdout

    archive = served.run("push", "support-bot", str(second), "--alias", "live",
                         "--alias", "canary,staging")
    assert "published support-bot version 2 (new)" in archive.stdout
    assert "rank / alpha    4 / 16" in archive.stdout
    for line in ("live: 1 -> 2 (revision 2)", "canary: none -> 2 (revision 1)",
                 "staging: none -> 2 (revision 1)"):
        assert line in archive.stdout

    listed = served.run("--json", "versions", "support-bot").json()
    assert [(v["version"], v["notes"]) for v in listed["versions"]] == [(2, ""), (1, "first cut")]
    table = served.run("versions", "support-bot").stdout
    assert "canary, live, staging" in table and "first cut" in table
    assert [v["version"] for v in
            served.run("--json", "versions", "support-bot", "--limit", "1").json()["versions"]
            ] == [2]

    assert "support-bot live: 2 -> 1 (revision 3)" in \
        served.run("promote", "support-bot", "1").stdout
    assert "support-bot live: unchanged at 1 (revision 3)" in \
        served.run("promote", "support-bot", "1").stdout
    stale = served.run("--json", "promote", "support-bot", "2", "--expected-revision", "1",
                       expect=1)
    assert stale.json()["error"]["status"] == 409
    assert "is at revision 3, not 1" in stale.stderr
    assert "support-bot live: 1 -> 2 (revision 4)" in served.run("rollback", "support-bot").stdout
    refused = served.run("rollback", "support-bot", "--alias", "canary", expect=1)
    assert "canary" in refused.stderr and "error:" in refused.stderr

    history = served.run("--json", "history", "support-bot").json()
    assert [(m["revision"], m["action"], m["from_version"], m["to_version"])
            for m in history["moves"]] == [(4, "rollback", 1, 2), (3, "promote", 2, 1),
                                           (2, "publish", 1, 2), (1, "publish", None, 1)]
    assert "rollback" in served.run("history", "support-bot").stdout

    events = served.run("--json", "events", "--after", str(start)).json()["events"]
    moves = [(e["alias"], e["action"], e["version"]) for e in events
             if e["type"] == "adapter_updated"]
    assert moves == [("live", "publish", 1), ("live", "publish", 2), ("canary", "publish", 2),
                     ("staging", "publish", 2), ("live", "promote", 1), ("live", "rollback", 2)]
    assert [e["target"]["version"] for e in events if e["type"] == "version_published"] == [1, 2]
    lines = served.run("events", "--after", str(start)).stdout.splitlines()
    assert len(lines) == len(events)
    assert " ".join(lines[-1].split()).endswith(
        "acme/support-bot live: 1 -> 2 (rollback, revision 4)")


def event_polls(served: ServedRegistry) -> float:
    """How many ``GET /v1/events`` the registry has answered, from its own metrics."""
    text = httpx.get(served.url + "/metrics", timeout=10).text
    wanted = {"method": "GET", "route": "/v1/events", "status": "200"}
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == "loraplane_registry_requests_total"
               and sample.labels == wanted)


async def _polled_since(served: ServedRegistry, polls: float) -> bool:
    return event_polls(served) > polls


def _reader(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def test_events_follow_prints_new_events_and_ctrl_c_exits_0(served: ServedRegistry) -> None:
    after, polls = event_end(served), event_polls(served)
    # Interruptible however the suite was started (a background job ignores SIGINT).
    follower = subprocess.Popen([*INTERRUPTIBLE_CLI, "--json", "events", "--follow", "--after",
                                 str(after), "--interval", "0.2"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=served.env())
    try:
        lines: queue.Queue[str] = queue.Queue()
        assert follower.stdout is not None
        threading.Thread(target=_reader, args=(follower.stdout, lines), daemon=True).start()
        # Let it poll the (empty) end of the log first: the event must come by following.
        asyncio.run(eventually(lambda: _polled_since(served, polls), timeout_s=60,
                               interval_s=0.1, retrying=RETRY_OVER_HTTP,
                               what="the follower's first poll"))
        served.run("promote", "support-bot", "1")
        event = json.loads(lines.get(timeout=30))
        assert (event["type"], event["action"], event["version"]) == (
            "adapter_updated", "promote", 1)
        assert event["seq"] == after + 1
        follower.send_signal(signal.SIGINT)
        assert follower.wait(30) == 0
        assert follower.stderr is not None
        assert "Traceback" not in follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def test_tokens_create_list_and_revoke(served: ServedRegistry) -> None:
    created = served.run("token", "create", "ci-bot", "--role", "publisher", "--tenant", "acme")
    secret = created.stdout.strip()
    assert secret and "\n" not in secret
    assert "not shown again" in created.stderr

    listed = served.run("--json", "token", "list")
    assert secret not in listed.stdout
    token = next(t for t in listed.json()["tokens"] if t["name"] == "ci-bot")
    assert (token["role"], token["tenant"], token["revoked_at"]) == ("publisher", "acme", None)
    assert secret.startswith(token["prefix"])

    as_bot = served.run("--json", "versions", "support-bot", LORAPLANE_TOKEN=secret)
    assert as_bot.json()["versions"]
    denied = served.run("--token", secret, "token", "list", expect=1)
    assert "admin" in denied.stderr

    assert f"revoked token {token['id']}" in \
        served.run("token", "revoke", str(token["id"])).stdout
    revoked = served.run("versions", "support-bot", LORAPLANE_TOKEN=secret, expect=1)
    assert "revoked" in revoked.stderr
    table = served.run("token", "list", "--all").stdout
    assert "ci-bot" in table and "bootstrap-admin" in table


def test_adapters_list_filters_and_delete(served: ServedRegistry) -> None:
    served.run("adapters", "create", "beta-one", "--base-model", "other-base",
               "--tenant", "beta")
    served.run("adapters", "create", "beta-two", "--base-model", "other-base",
               "--tenant", "beta")
    names = [a["name"] for a in
             served.run("--json", "adapters", "list", "--tenant", "beta").json()["adapters"]]
    assert sorted(names) == ["beta-one", "beta-two"]
    table = served.run("adapters", "list", "--base-model", "tiny-llama").stdout
    assert "support-bot" in table and "beta-one" not in table

    assert "--yes" in served.run("adapters", "delete", "beta-one", expect=2).stderr
    assert "deleted adapter beta-one" in \
        served.run("adapters", "delete", "beta-one", "--yes").stdout
    gone = served.run("adapters", "show", "beta-one", expect=1)
    assert "adapter 'beta-one' not found" in gone.stderr


def test_adapters_create_and_place_set_replicas(served: ServedRegistry) -> None:
    made = served.run("--json", "adapters", "create", "placed-one", "--base-model",
                      "tiny-llama", "--tenant", "beta", "--replicas", "2").json()
    assert made["replicas"] == 2
    assert "replicas 1" in served.run("adapters", "place", "placed-one", "--replicas", "1").stdout
    assert "replicas" in served.run("adapters", "show", "placed-one").stdout
    human = served.run("rollout", "placed-one").stdout
    assert "placement: 1 replica(s), placed on" in human, human
    cleared = served.run("--json", "adapters", "place", "placed-one", "--clear").json()
    assert cleared["replicas"] is None
    assert "either --replicas" in served.run("adapters", "place", "placed-one", expect=2).stderr
    bad = served.run("adapters", "place", "placed-one", "--replicas", "0", expect=1)
    assert "replicas must be" in bad.stderr


def test_agents_and_rollout_show_the_fleet(served: ServedRegistry) -> None:
    secret = served.run("token", "create", "gpu-1", "--role", "agent").stdout.strip()
    status: dict[str, Any] = {
        "agent_id": "gpu-1", "base_model": "tiny-llama", "time": datetime.now(UTC).isoformat(),
        "served": [{"adapter": "support-bot", "alias": "live", "version": 1,
                    "state": "serving"}],
        "failures": [{"adapter": "support-bot", "alias": "canary", "version": 2,
                      "state": "failed", "code": "rank_too_large", "reason": "rank 4 > 2"}],
    }
    httpx.post(f"{served.url}/v1/agents/gpu-1/status", json=status,
               headers={"Authorization": f"Bearer {secret}"}).raise_for_status()

    agents = served.run("agents").stdout
    assert "gpu-1" in agents and "support-bot@1 (live)" in agents
    assert "support-bot@2: rank_too_large" in agents
    rollout = served.run("--json", "rollout", "support-bot").json()
    live = next(a for a in rollout["aliases"] if a["alias"] == "live")
    assert [e["agent_id"] for e in live["serving"]] == ["gpu-1"] and live["converged"]
    human = served.run("rollout", "support-bot").stdout
    assert "support-bot (tenant acme, base model tiny-llama): 1 fresh agent(s)" in human
    assert "gpu-1: rank_too_large" in human


def test_errors_are_one_clear_message_and_a_non_zero_exit(served: ServedRegistry,
                                                          tmp_path: Path) -> None:
    unknown = served.run("versions", "no-such-adapter", expect=1)
    assert unknown.stdout == ""
    assert "error: adapter 'no-such-adapter' not found" in unknown.stderr
    as_json = served.run("--json", "promote", "no-such-adapter", "1", expect=1).json()
    assert as_json["error"]["status"] == 404
    assert as_json["error"]["message"] == "adapter 'no-such-adapter' not found"

    url = f"http://127.0.0.1:{free_port()}"
    unreachable = served.run("--registry", url, "adapters", "list", expect=1)
    assert f"cannot reach the registry at {url}" in unreachable.stderr

    no_token = served.run("adapters", "list", expect=1, LORAPLANE_DATA_DIR=str(tmp_path))
    assert "LORAPLANE_TOKEN" in no_token.stderr

    folder = make_adapter(tmp_path / "half")
    (folder / "adapter_model.safetensors").unlink()
    missing = served.run("push", "support-bot", str(folder), expect=2)
    assert "adapter_model.safetensors is missing" in missing.stderr
    invalid = served.run("push", "support-bot", str(make_adapter(tmp_path / "wrong",
                                                                 base_model="other")),
                         expect=1)
    assert "error: adapter was trained on 'other'" in invalid.stderr
    assert "[base_model_mismatch]" in invalid.stderr


def test_push_takes_a_save_pretrained_folder_unchanged(served: ServedRegistry,
                                                     tmp_path: Path) -> None:
    """What PEFT's save_pretrained writes: a local base path and a README.md."""
    served.run("adapters", "create", "peft-bot", "--base-model", "tiny-llama", "--tenant", "acme")
    folder = make_adapter(tmp_path / "out", base_model=str(tmp_path / "base"), seed=3)
    (folder / "README.md").write_text("---\nlibrary_name: peft\n---\n")
    pushed = served.run("push", "peft-bot", str(folder))
    assert "published" in pushed.stdout
    assert "without a shape check here" in " ".join(pushed.stderr.split())
    for fmt in ("tar.gz", "zip"):
        archive = pack_adapter(folder, tmp_path / f"out.{fmt}", fmt=fmt)
        again = served.run("--json", "push", "peft-bot", str(archive)).json()
        assert (again["version"], again["created"]) == (1, False)
        assert [f["name"] for f in again["files"]] == ["adapter_config.json",
                                                        "adapter_model.safetensors"]


def test_push_draws_progress_only_on_a_terminal(served: ServedRegistry, tmp_path: Path) -> None:
    served.run("adapters", "create", "tty-bot", "--base-model", "tiny-llama", "--tenant", "acme")
    folder = make_adapter(tmp_path / "big", hidden=512, intermediate=1024, layers=4)
    primary, secondary = os.openpty()
    process = subprocess.Popen([*CLI, "push", "tty-bot", str(folder)], stdin=secondary,
                               stdout=secondary, stderr=secondary,
                               env=served.env(COLUMNS="120"))
    os.close(secondary)
    screen = bytearray()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 1)
        try:
            chunk = os.read(primary, 65536) if ready else b""
        except OSError:  # the terminal closed: the child has exited
            break
        screen.extend(chunk)
        if not chunk and process.poll() is not None:
            break
    os.close(primary)
    assert process.wait(30) == 0, screen.decode(errors="replace")
    text = screen.decode(errors="replace")
    assert "uploading tty-bot" in text
    assert "published" in text and "tty-bot version 1 (new)" in text


def test_registry_commands_refuse_bad_settings_and_migrate(tmp_path: Path) -> None:
    def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120,
                              env=clean_env(**env), check=False)

    bad = cli("registry", "serve", "--data-dir", str(tmp_path / "x"), LORAPLANE_PORT="99999",
              LORAPLANE_MAX_FILE_BYTES="10", LORAPLANE_MAX_UPLOAD_BYTES="5")
    assert bad.returncode == 2, bad.stderr
    assert "invalid registry settings" in bad.stderr
    assert "port (LORAPLANE_PORT): Input should be less than or equal to 65535" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "x").exists()
    unpaired = cli("registry", "serve", "--base-model-config", "tiny-llama")
    assert unpaired.returncode == 2 and "is not NAME=PATH" in unpaired.stderr
    unreadable = cli("registry", "serve", "--data-dir", str(tmp_path / "x"),
                     "--base-model-config", f"tiny-llama={tmp_path / 'none.json'}")
    assert unreadable.returncode == 2, unreadable.stderr
    assert "base_model_configs['tiny-llama']: cannot read base model config" in (
        " ".join(unreadable.stderr.split()))

    url = f"sqlite:///{tmp_path / 'm.db'}"
    up = cli("--json", "registry", "migrate", "--database-url", url)
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout) | {"database": None} == {
        "database": None, "from": None, "to": head_revision(), "changed": True}
    again = cli("registry", "migrate", "--database-url", url)
    assert f"already at {head_revision()}" in again.stdout
    down = cli("--json", "registry", "migrate", "--database-url", url, "--downgrade", "base")
    assert json.loads(down.stdout)["to"] is None
    wrong = cli("registry", "migrate", "--database-url", url, "--revision", "nope")
    assert wrong.returncode == 1 and "nope" in wrong.stderr
