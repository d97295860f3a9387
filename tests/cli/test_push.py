"""``loraplane push`` stores a version without serving it, refuses another base model's
shapes, and says what it warns about first; ``adapters list`` shows the aliases."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devharness.adapters import make_adapter
from tests.cli.conftest import CALL_TIMEOUT_S, CLI, ServedRegistry

pytestmark = pytest.mark.e2e


def create(served: ServedRegistry, name: str) -> None:
    served.run("adapters", "create", name, "--base-model", "tiny-llama", "--tenant", "acme")


def test_push_moves_no_alias_unless_asked_and_says_how_to_serve(
        served: ServedRegistry, tmp_path: Path) -> None:
    create(served, "stored-bot")
    pushed = served.run("push", "stored-bot", str(make_adapter(tmp_path / "a", seed=1)))
    assert "aliases: none moved" in pushed.stdout
    assert "serve it: loraplane promote stored-bot 1 --alias live" in pushed.stdout
    assert served.run("--json", "adapters", "show", "stored-bot").json()["aliases"] == []
    as_json = served.run("--json", "push", "stored-bot",
                         str(make_adapter(tmp_path / "b", seed=2))).json()
    assert (as_json["version"], as_json["aliases"]) == (2, [])
    served.run("promote", "stored-bot", "1", "--alias", "live")
    served.run("push", "stored-bot", str(make_adapter(tmp_path / "c", seed=3)),
               "--alias", "canary")
    listed = served.run("adapters", "list").stdout
    row = next(line for line in listed.splitlines() if "stored-bot" in line)
    assert "canary→3, live→1" in row
    assert max(len(line) for line in listed.splitlines()) <= 80


def test_a_version_for_another_hidden_size_is_refused_unless_overridden(
        served: ServedRegistry, tmp_path: Path) -> None:
    create(served, "sized-bot")
    served.run("push", "sized-bot", str(make_adapter(tmp_path / "a", seed=1)), "--alias", "live")
    # Another rank is the same base model: accepted.
    served.run("push", "sized-bot", str(make_adapter(tmp_path / "r", seed=2, rank=4)))
    small = make_adapter(tmp_path / "small", seed=3, hidden=64, intermediate=128)
    refused = served.run("--json", "push", "sized-bot", str(small), "--alias", "live", expect=1)
    error = refused.json()["error"]
    assert (error["status"], error["code"]) == (422, "shape_mismatch")
    assert error["detail"]["in_features"] == 64 and error["detail"]["expected_in_features"] == 128
    assert "--allow-shape-change" in error["message"]
    versions = served.run("--json", "versions", "sized-bot").json()["versions"]
    assert [v["version"] for v in versions] == [2, 1]
    allowed = served.run("--json", "push", "sized-bot", str(small),
                         "--allow-shape-change").json()
    assert (allowed["version"], allowed["shape_change_allowed"]) == (3, True)
    assert any("allow_shape_change" in w for w in allowed["warnings"])


def test_warnings_come_before_the_summary(served: ServedRegistry, tmp_path: Path) -> None:
    create(served, "warned-bot")
    folder = make_adapter(tmp_path / "out", base_model=str(tmp_path / "base"), seed=4)
    # One stream, unbuffered, so the order on screen is the order written.
    done = subprocess.run([*CLI, "push", "warned-bot", str(folder)], capture_output=False,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=CALL_TIMEOUT_S, env=served.env(PYTHONUNBUFFERED="1"),
                          check=False)
    assert done.returncode == 0, done.stdout
    screen = " ".join(done.stdout.split())
    assert screen.index("warning:") < screen.index("published warned-bot version 1")
    assert "without a shape check here" in screen
