"""Identifiers in events and snapshots are checked as the registry checks them, before
anything names a path, a vLLM model, a metric label or a route with them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from loraplane.events import DesiredState, parse_event

SHA = "a" * 64
FILE = {"name": "adapter_config.json", "size": 10, "sha256": SHA,
        "url": "/v1/adapters/bot/versions/3/files/adapter_config.json"}
TARGET = {"adapter": "bot", "version": 3, "digest": SHA, "base_model": "tiny", "rank": 8,
          "alpha": 16, "target_modules": ["q_proj"], "files": [FILE]}
MOVE = {"type": "adapter_updated", "event_id": "e", "seq": 1,
        "time": "2026-11-29T00:00:00Z", "tenant": "acme", "adapter": "bot", "alias": "live",
        "revision": 2, "action": "promote", "base_model": "tiny", "version": 3,
        "previous_version": 2, "digest": SHA, "rank": 8, "files": [FILE], "target": TARGET}


def changed(path: list[str | int], value: Any) -> dict[str, Any]:
    event = copy.deepcopy(MOVE)
    place: Any = event
    for step in path[:-1]:
        place = place[step]
    place[path[-1]] = value
    return event


def test_a_valid_move_parses() -> None:
    assert parse_event(json.dumps(MOVE)).type == "adapter_updated"


@pytest.mark.parametrize(("path", "value"), [
    (["adapter"], "../../x"), (["adapter"], "Bot"), (["tenant"], "acme/evil"),
    (["tenant"], "_other"), (["alias"], "live\n"), (["version"], 0), (["version"], -1),
    (["revision"], -5), (["digest"], "d"), (["target", "adapter"], "../../x"),
    (["target", "version"], 0), (["target", "rank"], 0),
    (["target", "files", 0, "name"], "../config"), (["target", "files", 0, "name"], ".x"),
    (["target", "files", 0, "name"], "a/b"), (["target", "files", 0, "name"], "a\x00b"),
    (["target", "files", 0, "sha256"], "zz"), (["target", "files", 0, "size"], -1),
])
def test_a_bad_identifier_is_refused(path: list[str | int], value: Any) -> None:
    with pytest.raises(ValidationError):
        parse_event(json.dumps(changed(path, value)))


def test_a_route_rule_names_slugs_only() -> None:
    rule = {"kind": "customer", "key": "c1", "adapter": "../x", "alias": "live",
            "tenant": "acme", "base_model": "tiny"}
    event = {"type": "route_changed", "event_id": "e", "seq": 1, "time": MOVE["time"],
             "tenant": "acme", "adapter": "x", "kind": "customer", "key": "c1",
             "rule": rule, "route_revision": 1}
    with pytest.raises(ValidationError):
        parse_event(json.dumps(event))


def test_the_snapshot_is_checked_too() -> None:
    snapshot = {"base_model": "tiny", "stream_seq": 1, "event_seq": 1, "routes": [],
                "adapters": [{"tenant": "acme", "name": "../../x", "base_model": "tiny",
                              "aliases": []}]}
    with pytest.raises(ValidationError):
        DesiredState.model_validate(snapshot)
