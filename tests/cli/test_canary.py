"""``loraplane canary``, ``push --canary`` and ``promote --abort-canary`` against a real
registry (``served``, the embedded default in its own process); each test has its own
adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from devharness.adapters import make_adapter
from tests.cli.conftest import ServedRegistry

pytestmark = pytest.mark.e2e


def _adapter(served: ServedRegistry, name: str, folder: Path, versions: int) -> None:
    """``name`` with ``versions`` versions, ``live`` on version 1."""
    served.run("adapters", "create", name, "--base-model", "tiny-llama", "--tenant", "cli")
    for seed in range(1, versions + 1):
        served.run("push", name, str(make_adapter(folder / str(seed), seed=seed)),
                   *(("--alias", "live") if seed == 1 else ()))


def test_start_status_pause_resume_abort_and_list(served: ServedRegistry,
                                                  tmp_path: Path) -> None:
    _adapter(served, "cli-canary", tmp_path, 2)
    started = served.run("--json", "canary", "start", "cli-canary", "2", "--steps", "5,20",
                         "--step-seconds", "30", "--on-failure", "pause").json()
    assert (started["state"], started["weight"], started["steps"]) == ("progressing", 5, [5, 20])
    assert started["on_failure"] == "pause" and started["step_seconds"] == 30
    status = served.run("canary", "status", "cli-canary").stdout
    assert f"{started['id']} on cli-canary@live" in status and "5% (step 1 of [5, 20])" in status
    assert "no step judged yet" in status
    assert "checks, this step so far" in status and "inconclusive" in status
    paused = served.run("canary", "pause", "cli-canary", "--reason", "lunch").stdout
    assert paused.strip() == f"canary {started['id']} on cli-canary@live: paused, weight 5%"
    served.run("canary", "resume", "cli-canary")
    aborted = served.run("--json", "canary", "abort", "cli-canary").json()
    assert (aborted["state"], aborted["weight"]) == ("aborted", 0)
    gone = served.run("canary", "status", "cli-canary", expect=None)
    assert gone.returncode != 0 and "no_canary" in gone.stderr
    listed = served.run("--json", "canary", "list", "cli-canary").json()
    assert [c["state"] for c in listed["canaries"]] == ["aborted"]
    history = served.run("--json", "history", "cli-canary").json()["moves"]
    assert [(m["action"], m["reason"]) for m in history][:3] == [
        ("canary_abort", "aborted by bootstrap-admin"),
        ("canary_resume", "resumed by bootstrap-admin"),
        ("canary_pause", "paused by bootstrap-admin: lunch")]
    table = served.run("canary", "list", "cli-canary").stdout
    assert "aborted" in table and "cli-canary@live: canaries" in table


def test_bad_steps_are_refused_before_and_by_the_registry(served: ServedRegistry,
                                                          tmp_path: Path) -> None:
    _adapter(served, "cli-canary-bad", tmp_path, 2)
    local = served.run("canary", "start", "cli-canary-bad", "2", "--steps", "ten", expect=None)
    assert local.returncode == 2 and "weights in percent" in local.stderr
    remote = served.run("canary", "start", "cli-canary-bad", "2", "--steps", "50,10",
                        expect=None)
    assert remote.returncode != 0 and "invalid_request" in remote.stderr
    same = served.run("canary", "start", "cli-canary-bad", "1", expect=None)
    assert same.returncode != 0 and "canary_is_stable" in same.stderr
    broken = tmp_path / "broken.json"
    for text, said in (("{not json", "Invalid JSON"),
                       ('{"min_requests": 0}', "min_requests"),
                       ('{"webhooks": [{"name": "x", "url": "ftp://h/"}]}', "webhooks.0.url")):
        broken.write_text(text)
        refused = served.run("canary", "start", "cli-canary-bad", "2", "--analysis",
                             str(broken), expect=None)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"webhooks": [{"name": "x", "url": "http://10.0.0.1/"}]}')
    remote = served.run("canary", "start", "cli-canary-bad", "2", "--analysis",
                        str(elsewhere), expect=None)
    assert remote.returncode != 0 and "webhook_host_not_allowed" in remote.stderr


def test_start_takes_the_analysis_from_a_file(served: ServedRegistry, tmp_path: Path) -> None:
    _adapter(served, "cli-canary-file", tmp_path, 2)
    analysis = tmp_path / "analysis.json"
    analysis.write_text('{"min_requests": 500, "max_error_rate": 0.01, "failure_limit": 2}')
    started = served.run("--json", "canary", "start", "cli-canary-file", "2", "--analysis",
                         str(analysis)).json()
    assert {k: started["analysis"][k] for k in ("min_requests", "max_error_rate",
                                                 "failure_limit")} == {
        "min_requests": 500, "max_error_rate": 0.01, "failure_limit": 2}


def test_push_with_a_canary_and_a_promote_that_aborts_it(served: ServedRegistry,
                                                        tmp_path: Path) -> None:
    _adapter(served, "cli-canary-push", tmp_path, 1)
    both = served.run("--json", "push", "cli-canary-push",
                      str(make_adapter(tmp_path / "new", seed=7)), "--canary", "10").json()
    assert both["upload"]["version"] == 2 and both["upload"]["aliases"] == []
    assert (both["canary"]["canary_version"], both["canary"]["stable_version"],
            both["canary"]["steps"]) == (2, 1, [10])
    clash = served.run("push", "cli-canary-push", str(make_adapter(tmp_path / "x", seed=8)),
                       "--canary", "10", "--alias", "live", expect=None)
    assert clash.returncode == 2 and "do not also move it" in clash.stderr
    refused = served.run("promote", "cli-canary-push", "2", expect=None)
    assert refused.returncode != 0 and "canary_running" in refused.stderr
    moved = served.run("--json", "promote", "cli-canary-push", "2", "--abort-canary").json()
    assert moved["version"] == 2 and moved["changed"] is True
    assert served.run("--json", "canary", "list", "cli-canary-push").json()[
        "canaries"][0]["state"] == "aborted"
