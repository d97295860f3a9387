"""Canaries through the REST API, on both backends: the lifecycle (start, read, pause,
resume, promote, abort, list), one per alias, alias moves refused while one runs unless
they abort it, every transition in the alias's history and the events with its actor and
reason, roles and tenants, and bad input refused with its code."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from tests.registry.canaries.support import (
    ALIAS,
    CANARY,
    alias_events,
    bot,
    call,
    history,
    start_canary,
)


async def test_a_canary_starts_pauses_resumes_and_aborts(registry: RegistryHarness,
                                                        tmp_path: Path) -> None:
    await bot(registry, tmp_path)
    status, canary = await start_canary(registry, steps=[10, 50], step_seconds=30,
                                  on_failure="pause")
    assert status == 201, canary
    assert {k: canary[k] for k in ("adapter", "alias", "stable_version", "canary_version",
                                   "state", "step", "weight", "steps", "step_seconds",
                                   "on_failure", "checks", "actor")} == {
        "adapter": "bot", "alias": "live", "stable_version": 1, "canary_version": 2,
        "state": "progressing", "step": 1, "weight": 10, "steps": [10, 50],
        "step_seconds": 30, "on_failure": "pause", "checks": [], "actor": "bootstrap-admin"}
    assert canary["analysis"]["min_requests"] == 50
    assert canary["reason"] == "started by bootstrap-admin: version 2 on 10% of 'live'"
    status, read = await call(registry, "GET", CANARY)
    assert status == 200 and {**read, "live_checks": None} == canary
    assert {c["metric"]: (c["stable_requests"], c["canary_requests"], c["verdict"])
            for c in read["live_checks"]}["requests"] == (0, 0, "inconclusive")
    status, again = await start_canary(registry, version=3)
    assert status == 409 and again["error"]["code"] == "canary_exists"

    status, paused = await call(registry, "POST", f"{CANARY}/pause",
                                 json={"reason": "looking at the dashboards"})
    assert status == 200 and paused["state"] == "paused" and paused["weight"] == 10
    assert paused["reason"] == "paused by bootstrap-admin: looking at the dashboards"
    status, twice = await call(registry, "POST", f"{CANARY}/pause")
    assert status == 409 and twice["error"]["code"] == "canary_not_progressing"
    status, resumed = await call(registry, "POST", f"{CANARY}/resume")
    assert status == 200 and resumed["state"] == "progressing"
    status, not_paused = await call(registry, "POST", f"{CANARY}/resume")
    assert status == 409 and not_paused["error"]["code"] == "canary_not_paused"
    status, aborted = await call(registry, "POST", f"{CANARY}/abort", json={"reason": "bad"})
    assert status == 200 and (aborted["state"], aborted["weight"]) == ("aborted", 0)
    assert aborted["reason"] == "aborted by bootstrap-admin: bad"

    status, gone = await call(registry, "GET", CANARY)
    assert status == 404 and gone["error"]["code"] == "no_canary"
    assert await history(registry) == [("canary_abort", 1, 1), ("canary_resume", 1, 1),
                                        ("canary_pause", 1, 1), ("canary_start", 1, 1),
                                        ("publish", None, 1)]
    events = await alias_events(registry)
    assert [(e["action"], e["version"], e["canary"] and e["canary"]["weight"])
            for e in events] == [("publish", 1, None), ("canary_start", 1, 10),
                                 ("canary_pause", 1, 10), ("canary_resume", 1, 10),
                                 ("canary_abort", 1, None)]
    start = events[1]["canary"]
    assert start["id"] == canary["id"] and start["target"]["version"] == 2
    assert [e["revision"] for e in events] == [1, 2, 3, 4, 5]
    assert events[-1]["reason"] == "aborted by bootstrap-admin: bad"


async def test_promotion_moves_the_alias_once_and_a_rollback_undoes_it(
        registry: RegistryHarness, tmp_path: Path) -> None:
    await bot(registry, tmp_path)
    assert (await start_canary(registry))[0] == 201
    status, promoted = await call(registry, "POST", f"{CANARY}/promote")
    assert status == 200 and (promoted["state"], promoted["weight"]) == ("promoted", 100)
    status, alias = await call(registry, "GET", f"{ALIAS}/history")
    assert alias["moves"][0]["action"] == "canary_promote"
    assert alias["moves"][0]["reason"] == "promoted by bootstrap-admin"
    assert await history(registry) == [("canary_promote", 1, 2), ("canary_start", 1, 1),
                                        ("publish", None, 1)]
    assert (await alias_events(registry))[-1]["canary"] is None
    # The canary's holds are not moves: a rollback undoes the promotion, then the push.
    status, rolled = await call(registry, "POST", f"{ALIAS}/rollback")
    assert status == 200 and rolled["version"] == 1, rolled
    status, body = await call(registry, "POST", f"{ALIAS}/rollback")
    assert status == 409 and body["error"]["code"] == "no_previous_version"


async def test_moving_the_alias_by_hand_is_refused_unless_it_aborts_the_canary(
        registry: RegistryHarness, tmp_path: Path) -> None:
    await bot(registry, tmp_path)
    assert (await call(registry, "PUT", ALIAS, json={"version": 3}))[0] == 200
    assert (await start_canary(registry))[0] == 201  # so a rollback has a move to undo
    refused = [await call(registry, "PUT", ALIAS, json={"version": 1}),
               await call(registry, "POST", f"{ALIAS}/rollback"),
               await call(registry, "DELETE", ALIAS)]
    pushed = await upload_dir(registry, "bot", make_adapter(tmp_path / "4", seed=4),
                              aliases="live")
    refused.append((pushed.status_code, pushed.json()))
    assert [(status, body["error"]["code"]) for status, body in refused] == [
        (409, "canary_running")] * 4
    assert (await call(registry, "GET", CANARY))[1]["state"] == "progressing"

    pushed = await upload_dir(registry, "bot", make_adapter(tmp_path / "5", seed=5),
                              aliases="live", fields={"abort_canary": "true"})
    assert pushed.status_code == 201, pushed.text
    assert (await call(registry, "GET", CANARY))[0] == 404
    _, listed = await call(registry, "GET", f"{ALIAS}/canaries")
    assert listed["canaries"][0]["state"] == "aborted"
    assert listed["canaries"][0]["reason"] == ("aborted by bootstrap-admin: the alias was "
                                               "moved by hand (publish)")
    # Version 4: the refused push left no version behind.
    assert (await history(registry))[:2] == [("publish", 3, 4), ("canary_abort", 3, 3)]
    # With no canary running, a plain move goes through again.
    assert (await call(registry, "PUT", ALIAS, json={"version": 3}))[0] == 200
    assert (await start_canary(registry))[0] == 201
    status, moved = await call(registry, "PUT", ALIAS, json={"version": 1,
                                                              "abort_canary": True})
    assert status == 200 and moved["version"] == 1


async def test_roles_and_tenants(registry: RegistryHarness, tmp_path: Path) -> None:
    await bot(registry, tmp_path)
    reader = await registry.token("reader", "acme")
    publisher = await registry.token("publisher", "acme")
    stranger = await registry.token("publisher", "other")
    status, body = await call(registry, "POST", CANARY, reader, json={"version": 2})
    assert status == 403, body
    status, body = await call(registry, "POST", CANARY, stranger, json={"version": 2})
    assert status == 404 and body["error"]["code"] == "adapter_not_found", body
    status, started = await call(registry, "POST", CANARY, publisher, json={"version": 2})
    assert status == 201 and started["actor"] == "publisher-acme"
    assert (await call(registry, "GET", CANARY, reader))[0] == 200
    assert (await call(registry, "GET", f"{ALIAS}/canaries", reader))[0] == 200
    assert (await call(registry, "GET", CANARY, stranger))[0] == 404
    for action in ("pause", "resume", "promote", "abort"):
        assert (await call(registry, "POST", f"{CANARY}/{action}", reader))[0] == 403
        assert (await call(registry, "POST", f"{CANARY}/{action}", stranger))[0] == 404
    assert (await call(registry, "POST", f"{CANARY}/abort", publisher))[0] == 200


async def test_bad_input_is_refused_with_its_code(registry: RegistryHarness,
                                                 tmp_path: Path) -> None:
    await bot(registry, tmp_path)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"version": 9}, 404, "version_not_found"),
        ({"version": 1}, 422, "canary_is_stable"),
        ({"version": 2, "steps": [50, 10]}, 422, "invalid_request"),
        ({"version": 2, "steps": [10, 10]}, 422, "invalid_request"),
        ({"version": 2, "steps": [0, 50]}, 422, "invalid_request"),
        ({"version": 2, "steps": [10, 100]}, 422, "invalid_request"),
        ({"version": 2, "steps": []}, 422, "invalid_request"),
        ({"version": 2, "step_seconds": 0}, 422, "invalid_request"),
        ({"version": 2, "step_seconds": 10**9}, 422, "invalid_request"),
        ({"version": 2, "on_failure": "explode"}, 422, "invalid_request"),
        ({"version": 2, "analysis": {"max_error_rate": 2}}, 422, "invalid_request"),
        ({"version": 2, "analysis": {"min_requests": 0}}, 422, "invalid_request"),
        ({"version": 2, "analysis": {"max_latency_p95_ratio": 0.5}}, 422, "invalid_request"),
        ({"version": 2, "analysis": {"typo": 1}}, 422, "invalid_request"),
        ({"version": 0}, 422, "invalid_request"),
    ]
    for body, want_status, code in cases:
        status, answer = await call(registry, "POST", CANARY, json=body)
        assert (status, answer["error"]["code"]) == (want_status, code), (body, answer)
    status, answer = await call(registry, "POST", "/v1/adapters/bot/aliases/nope/canary",
                                 json={"version": 2})
    assert status == 404 and answer["error"]["code"] == "alias_not_found"
    status, answer = await call(registry, "GET", f"{ALIAS}/canaries", params={"cursor": "x"})
    assert status == 400 and answer["error"]["code"] == "invalid_cursor"
    for action in ("pause", "resume", "promote", "abort"):
        status, answer = await call(registry, "POST", f"{CANARY}/{action}")
        assert status == 404 and answer["error"]["code"] == "no_canary"
    # Nothing was half-written: no canary, and the alias never moved.
    assert (await call(registry, "GET", f"{ALIAS}/canaries"))[1]["canaries"] == []
    assert await history(registry) == [("publish", None, 1)]


async def test_the_list_pages_newest_first(registry: RegistryHarness, tmp_path: Path) -> None:
    await bot(registry, tmp_path)
    ids = []
    for version in (2, 3, 2):
        status, started = await start_canary(registry, version=version)
        assert status == 201
        ids.append(started["id"])
        assert (await call(registry, "POST", f"{CANARY}/abort"))[0] == 200
    status, first = await call(registry, "GET", f"{ALIAS}/canaries", params={"limit": 2})
    assert status == 200 and [c["id"] for c in first["canaries"]] == ids[:0:-1]
    assert [c["canary_version"] for c in first["canaries"]] == [2, 3]
    status, rest = await call(registry, "GET", f"{ALIAS}/canaries",
                               params={"limit": 2, "cursor": first["next_cursor"]})
    assert [c["id"] for c in rest["canaries"]] == ids[:1] and rest["next_cursor"] is None


async def test_deleting_the_adapter_aborts_its_canary(registry: RegistryHarness,
                                                      tmp_path: Path) -> None:
    await bot(registry, tmp_path)
    assert (await start_canary(registry))[0] == 201
    response = await registry.client.delete("/v1/adapters/bot", headers=registry.admin_headers)
    assert response.status_code in (200, 204), response.text
    actions = [(e["action"], e["reason"]) for e in await alias_events(registry)][-2:]
    assert actions == [("canary_abort", "aborted by bootstrap-admin: the adapter was deleted"),
                       ("adapter_deleted", None)]


async def test_the_desired_state_carries_the_running_canary(registry: RegistryHarness,
                                                            tmp_path: Path) -> None:
    await bot(registry, tmp_path)

    async def live() -> dict[str, Any]:
        _, state = await call(registry, "GET", "/v1/desired",
                               params={"base_model": "tiny-llama", "adapter": "bot"})
        [alias] = state["adapters"][0]["aliases"]
        assert alias["alias"] == "live" and alias["target"]["version"] == 1
        return dict(alias)

    assert (await live())["canary"] is None
    _, started = await start_canary(registry, version=3, steps=[25])
    alias = await live()
    assert alias["canary"]["id"] == started["id"] and alias["canary"]["weight"] == 25
    assert alias["canary"]["target"]["version"] == 3 and alias["revision"] == 2
    assert (await call(registry, "POST", f"{CANARY}/abort"))[0] == 200
    alias = await live()
    assert alias["canary"] is None and alias["revision"] == 3


async def test_two_starts_at_once_make_one_canary(registry: RegistryHarness,
                                                  tmp_path: Path) -> None:
    await bot(registry, tmp_path)
    answers = await asyncio.gather(*(start_canary(registry, version=v) for v in (2, 3, 2, 3)))
    assert sorted(status for status, _ in answers) == [201, 409, 409, 409], answers
    assert {body["error"]["code"] for status, body in answers if status == 409} == {
        "canary_exists"}
    _, listed = await call(registry, "GET", f"{ALIAS}/canaries")
    assert len(listed["canaries"]) == 1
