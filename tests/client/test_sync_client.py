"""RegistryClient (blocking) against a real registry over HTTP.

The registry runs in this test's event loop, so each blocking scenario runs in a worker
thread. The calls are the ones AsyncRegistryClient makes (one definition in ``_calls``);
these tests check the blocking shell sends, streams and parses them the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from devharness.http_registry import Served
from loraplane.api.canaries import CanaryAnalysis
from loraplane.client import Conflict, NotFound, RegistryClient
from loraplane.events import AgentStatus


def publish_promote_history(url: str, token: str, first: Path, second: Path) -> None:
    with RegistryClient(url, token) as registry:
        registry.create_adapter("bot", "tiny-llama", tenant="acme")
        assert registry.push("bot", first, aliases=["live"]).version == 1
        assert registry.push("bot", second, aliases=["canary"], notes="v2").version == 2
        assert registry.move_alias("bot", "live", 2).revision == 2
        with pytest.raises(Conflict):
            registry.move_alias("bot", "live", 1, expected_revision=1)
        assert registry.rollback("bot").version == 1
        assert [m.action for m in registry.alias_history("bot").moves] == [
            "rollback", "promote", "publish"]
        newest = registry.alias_history("bot", limit=2)
        assert [m.revision for m in newest.moves] == [3, 2] and newest.next_cursor == "2"
        oldest = registry.alias_history("bot", limit=2, cursor=newest.next_cursor)
        assert [m.revision for m in oldest.moves] == [1] and oldest.next_cursor is None
        assert registry.delete_alias("bot", "canary").version is None
        assert [v.version for v in registry.list_versions("bot", limit=1)] == [2]
        assert registry.versions_page("bot").next_cursor is None
        assert registry.get_version("bot", 2).notes == "v2"
        assert registry.get_adapter("bot").latest_version == 2
        assert [a.name for a in registry.list_adapters(page_size=1)] == ["bot"]
        assert registry.adapters_page(tenant="acme").adapters[0].name == "bot"


def canaries(url: str, token: str) -> None:
    """``live`` is on version 1 of two: a canary of version 2 through every call."""
    with RegistryClient(url, token) as registry:
        started = registry.start_canary("bot", 2, steps=[10, 40], step_seconds=5,
                                        analysis=CanaryAnalysis(min_requests=3),
                                        on_failure="pause")
        assert (started.weight, started.steps, started.analysis.min_requests) == (10, [10, 40], 3)
        assert registry.get_canary("bot").model_copy(update={"live_checks": None}) == started
        assert registry.pause_canary("bot", reason="why").reason == "paused by bootstrap-admin: why"
        assert registry.resume_canary("bot").state == "progressing"
        with pytest.raises(Conflict) as running:
            registry.move_alias("bot", "live", 2)
        assert running.value.code == "canary_running"
        assert registry.abort_canary("bot").state == "aborted"
        registry.start_canary("bot", 2)
        assert registry.promote_canary("bot").state == "promoted"
        registry.start_canary("bot", 1)
        assert registry.rollback("bot", abort_canary=True).version == 1
        registry.start_canary("bot", 2)
        assert registry.move_alias("bot", "live", 2, abort_canary=True).version == 2
        listed = registry.list_canaries("bot", limit=3)
        assert [c.state for c in listed.canaries] == ["aborted", "aborted", "promoted"]
        assert registry.list_canaries("bot", cursor=listed.next_cursor).canaries[0].state == \
            "aborted"
        with pytest.raises(NotFound) as none:
            registry.get_canary("bot")
        assert none.value.code == "no_canary"


def download_first_file(url: str, token: str, dest: Path) -> str:
    with RegistryClient(url, token) as registry:
        ref = registry.get_version("bot", 1).files[0]
        registry.download(ref.url, dest, size=ref.size, sha256=ref.sha256)
        return ref.sha256


def routes_tokens_events_fleet(url: str, token: str) -> None:
    with RegistryClient(url, token) as registry:
        registry.put_route("task", "summarize", "bot", alias="live", tenant="acme")
        assert [r.key for r in registry.list_routes(tenant="acme").routes] == ["summarize"]
        registry.delete_route("task", "summarize", tenant="acme")
        assert registry.list_routes().routes == []
        created = registry.create_token("reader", "reader", tenant="acme")
        assert created.id in [t.id for t in registry.list_tokens().tokens]
        registry.revoke_token(created.id)
        assert registry.list_tokens(include_revoked=True).tokens[-1].revoked_at
        events = registry.read_events(limit=3)
        assert len(events.events) == 3 and registry.events_page(after=events.next_after)
        follow = registry.follow_events(after=0, interval_s=0.05)
        assert next(follow) == events.events[0]
        status = AgentStatus(agent_id="gpu-2", base_model="tiny-llama",
                             time=datetime.now(UTC), served=[])
        assert registry.report_status(status).agent_id == "gpu-2"
        registry.send_status(status.model_copy(update={"loaded": ["bot@1"]}))
        assert registry.list_agents().agents[0].status.loaded == ["bot@1"]
        assert [a.agent_id for a in registry.list_agents().agents] == ["gpu-2"]
        assert registry.rollout("bot").adapter == "bot"
        assert [a.name for a in registry.desired("tiny-llama").adapters] == ["bot"]
        registry.delete_adapter("bot")
        with pytest.raises(NotFound):
            registry.get_adapter("bot")


async def test_every_call_through_the_blocking_client(served: Served, adapter_dir: Path,
                                                      adapter_dir_2: Path,
                                                      tmp_path: Path) -> None:
    await asyncio.to_thread(publish_promote_history, served.url, served.admin_token,
                            adapter_dir, adapter_dir_2)
    dest = tmp_path / "downloaded"
    sha256 = await asyncio.to_thread(download_first_file, served.url, served.admin_token,
                                     dest)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == sha256
    await asyncio.to_thread(canaries, served.url, served.admin_token)
    await asyncio.to_thread(routes_tokens_events_fleet, served.url, served.admin_token)
