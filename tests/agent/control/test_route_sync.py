"""RouteSync: a revision the registry never had gives way at the next full read."""

from __future__ import annotations

import uuid

from inference_agent.control.route_sync import RouteSync
from inference_agent.serving.routes import RouteTable
from loraplane.events import DesiredState, RouteChanged, RouteRule
from tests.agent.loop_support import FakeSwapper

BASE = "tiny-llama"


def rule(key: str, adapter: str) -> RouteRule:
    return RouteRule(kind="customer", key=key, adapter=adapter, alias="live", tenant="acme",
                     base_model=BASE)


def change(key: str, adapter: str, revision: int) -> RouteChanged:
    return RouteChanged(event_id=str(uuid.uuid4()), seq=revision, time="2026-11-29T00:00:00Z",
                        tenant="acme", adapter=adapter, kind="customer", key=key,
                        rule=rule(key, adapter), route_revision=revision)


def snapshot(revision: int, *rules: RouteRule) -> DesiredState:
    return DesiredState(base_model=BASE, stream_seq=1, event_seq=1, adapters=[],
                        routes=list(rules), route_revisions={"acme": revision})


def keys(table: RouteTable) -> set[str]:
    return {r.key for r in table.rules()}


def test_a_revision_from_the_future_does_not_freeze_the_rules() -> None:
    table = RouteTable(BASE)
    sync = RouteSync(FakeSwapper(table))
    sync.take(snapshot(0), sync.mark())
    # Fifty revisions the registry never made, applied one after the other.
    for revision in range(1, 51):
        assert not sync.on_event(change(f"k{revision}", "bot", revision))
    assert len(keys(table)) == 50
    # The next full read (started after them) holds revision 1: the registry's word wins.
    since = sync.mark()
    sync.take(snapshot(1, rule("c1", "bot")), since)
    assert keys(table) == {"c1"}
    # And the registry's next change applies in place again.
    assert not sync.on_event(change("c2", "bot", 2))
    assert keys(table) == {"c1", "c2"}


def test_a_delta_applied_during_the_read_is_kept() -> None:
    table = RouteTable(BASE)
    sync = RouteSync(FakeSwapper(table))
    sync.take(snapshot(0), sync.mark())
    since = sync.mark()  # the read starts, then a change arrives before it answers
    assert not sync.on_event(change("c1", "bot", 1))
    sync.take(snapshot(0), since)
    assert keys(table) == {"c1"}
