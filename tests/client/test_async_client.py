"""AsyncRegistryClient against a real registry over HTTP: every call, typed answers."""

from __future__ import annotations

import hashlib
import shutil
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from devharness.http_registry import Served
from loraplane.api import AdapterOut, AliasState, UploadResult
from loraplane.client import (
    AsyncRegistryClient,
    Conflict,
    DownloadFailed,
    NotFound,
    RegistryError,
    Unauthorized,
)
from loraplane.client.multipart import CHECK_FIRST_ABOVE_BYTES
from loraplane.events import AgentStatus, ServedVersion, VersionPublished


def admin(served: Served) -> AsyncRegistryClient:
    return AsyncRegistryClient(served.url, served.admin_token)


async def test_adapters_versions_and_aliases(served: Served, adapter_dir: Path,
                                             adapter_dir_2: Path) -> None:
    async with admin(served) as registry:
        created = await registry.create_adapter("bot", "tiny-llama", tenant="acme",
                                                description="a test bot")
        assert isinstance(created, AdapterOut) and created.latest_version is None
        progress: list[tuple[int, int]] = []
        first = await registry.push("bot", adapter_dir, notes="first", aliases=["live"],
                                    on_progress=lambda sent, total: progress.append((sent, total)))
        assert isinstance(first, UploadResult) and first.created and first.version == 1
        assert [(a.alias, a.version) for a in first.aliases] == [("live", 1)]
        assert progress[0][0] == 0 and progress[-1][0] == progress[-1][1] > 0
        again = await registry.push("bot", adapter_dir, aliases=[])
        assert not again.created and again.version == 1 and again.aliases == []
        second = await registry.push("bot", adapter_dir_2, aliases=["canary"])
        assert second.version == 2

        moved = await registry.move_alias("bot", "live", 2, expected_revision=1)
        assert isinstance(moved, AliasState)
        assert (moved.previous_version, moved.version, moved.revision) == (1, 2, 2)
        with pytest.raises(Conflict) as stale:
            await registry.move_alias("bot", "live", 1, expected_revision=1)
        assert stale.value.status == 409 and not stale.value.retryable
        back = await registry.rollback("bot", expected_revision=2)
        assert (back.version, back.revision) == (1, 3)
        history = await registry.alias_history("bot", "live", limit=10)
        assert [m.action for m in history.moves] == ["rollback", "promote", "publish"]
        older = await registry.alias_history("bot", "live", limit=1, cursor="3")
        assert [m.action for m in older.moves] == ["promote"] and older.next_cursor == "2"
        removed = await registry.delete_alias("bot", "canary")
        assert removed.version is None

        shown = await registry.get_adapter("bot")
        assert shown.latest_version == 2 and [a.alias for a in shown.aliases] == ["live"]
        version = await registry.get_version("bot", 2)
        assert version.digest == second.digest and version.total_size > 0
        assert [v.version for v in await registry.list_versions("bot")] == [2, 1]
        page = await registry.versions_page("bot", limit=1)
        assert [v.version for v in page.versions] == [2] and page.next_cursor
        assert [a.name for a in await registry.list_adapters(tenant="acme")] == ["bot"]
        assert (await registry.adapters_page(base_model="other")).adapters == []

        await registry.delete_adapter("bot")
        with pytest.raises(NotFound) as gone:
            await registry.get_adapter("bot")
        assert gone.value.code == "adapter_not_found" and gone.value.status == 404


async def test_canaries(served: Served, adapter_dir: Path, adapter_dir_2: Path) -> None:
    async with admin(served) as registry:
        await registry.create_adapter("can", "tiny-llama", tenant="acme")
        await registry.push("can", adapter_dir, aliases=["live"])
        await registry.push("can", adapter_dir_2)
        started = await registry.start_canary("can", 2, steps=[25])
        assert (started.stable_version, started.canary_version, started.weight) == (1, 2, 25)
        assert (await registry.get_canary("can")).id == started.id
        assert (await registry.pause_canary("can")).state == "paused"
        assert (await registry.resume_canary("can")).state == "progressing"
        with pytest.raises(Conflict) as running:
            await registry.delete_alias("can", "live")
        assert running.value.code == "canary_running"
        promoted = await registry.promote_canary("can", reason="looks good")
        assert promoted.reason == "promoted by bootstrap-admin: looks good"
        assert (await registry.get_adapter("can")).aliases[0].version == 2
        await registry.start_canary("can", 1)
        assert (await registry.abort_canary("can")).weight == 0
        await registry.start_canary("can", 1)
        assert (await registry.delete_alias("can", "live", abort_canary=True)).version is None
        page = await registry.list_canaries("can")
        assert [c.state for c in page.canaries] == ["aborted", "aborted", "promoted"]
        assert [m.action for m in (await registry.alias_history("can")).moves][:2] == [
            "delete", "canary_abort"]


async def test_download_checks_size_and_sha256(served: Served, adapter_dir: Path,
                                               tmp_path: Path) -> None:
    async with admin(served) as registry:
        await registry.create_adapter("bot", "tiny-llama", tenant="acme")
        result = await registry.push("bot", adapter_dir, aliases=["live"])
        weights = next(f for f in result.files if f.name.endswith(".safetensors"))
        counted: list[int] = []
        dest = tmp_path / "weights"
        await registry.download(weights.url, dest, size=weights.size, sha256=weights.sha256,
                                on_bytes=counted.append)
        assert hashlib.sha256(dest.read_bytes()).hexdigest() == weights.sha256
        assert sum(counted) == weights.size
        with pytest.raises(DownloadFailed, match="sha256") as bad:
            await registry.download(weights.url, tmp_path / "x", size=weights.size,
                                    sha256="0" * 64)
        assert bad.value.retryable
        with pytest.raises(DownloadFailed, match="larger"):
            await registry.download(weights.url, tmp_path / "y", size=weights.size - 1,
                                    sha256=weights.sha256)
        with pytest.raises(DownloadFailed) as missing:
            await registry.download(weights.url.replace("/1/", "/42/"), tmp_path / "z",
                                    size=1, sha256="0" * 64)
        assert missing.value.detail["status"] == 404


async def test_routes_tokens_and_events(served: Served, adapter_dir: Path) -> None:
    async with admin(served) as registry:
        await registry.create_adapter("bot", "tiny-llama", tenant="acme")
        await registry.push("bot", adapter_dir, aliases=["live"])
        rule = await registry.put_route("customer", "c1", "bot")
        assert (rule.kind, rule.key, rule.adapter, rule.alias) == ("customer", "c1", "bot",
                                                                    "live")
        assert [r.key for r in (await registry.list_routes(kind="customer")).routes] == ["c1"]
        # The tenant is the rules' scope: named, it must be the adapter's.
        assert (await registry.put_route("task", "t1", "bot", tenant="acme")).tenant == "acme"
        assert [r.key for r in (await registry.list_routes(tenant="acme")).routes] == ["c1", "t1"]
        assert (await registry.list_routes(tenant="globex")).routes == []
        with pytest.raises(NotFound) as elsewhere:
            await registry.put_route("task", "t2", "bot", tenant="globex")
        assert elsewhere.value.code == "tenant_not_found"
        await registry.delete_route("task", "t1", tenant="acme")
        await registry.delete_route("customer", "c1")
        assert (await registry.list_routes()).routes == []

        token = await registry.create_token("ci", "publisher", tenant="acme")
        assert token.secret and token.role == "publisher" and token.tenant == "acme"
        listed = await registry.list_tokens()
        assert token.id in [t.id for t in listed.tokens]
        await registry.revoke_token(token.id)
        assert token.id not in [t.id for t in (await registry.list_tokens()).tokens]
        revoked = await registry.list_tokens(include_revoked=True)
        assert any(t.id == token.id and t.revoked_at for t in revoked.tokens)
        async with AsyncRegistryClient(served.url, token.secret) as refused:
            with pytest.raises(Unauthorized):
                await refused.list_adapters()

        events = await registry.read_events(after=0, limit=1000)
        types = [e["type"] for e in events.events]
        assert "version_published" in types and "route_changed" in types
        assert any(isinstance(e, VersionPublished) for e in events.parsed())
        one = await registry.events_page(after=0, limit=1)
        assert len(one.events) == 1 and one.next_after == one.events[0]["seq"]
        followed = []
        async for event in registry.follow_events(after=0, interval_s=0.05):
            followed.append(event)
            if len(followed) == len(events.events):
                break
        assert followed == events.events


async def test_agents_rollout_and_desired_state(served: Served, adapter_dir: Path) -> None:
    async with admin(served) as registry:
        await registry.create_adapter("bot", "tiny-llama", tenant="acme")
        await registry.push("bot", adapter_dir, aliases=["live"])
        agent_token = (await registry.create_token("gpu-1", "agent")).secret
    async with AsyncRegistryClient(served.url, agent_token) as agent:
        desired = await agent.desired("tiny-llama")
        assert [a.name for a in desired.adapters] == ["bot"]
        assert (await agent.desired("tiny-llama", adapter="nope")).adapters == []
        status = AgentStatus(
            agent_id="gpu-1", base_model="tiny-llama", time=datetime.now(UTC),
            served=[ServedVersion(adapter="bot", alias="live", version=1, state="serving")],
            loaded=["bot@1"])
        reported = await agent.report_status(status)
        assert reported.agent_id == "gpu-1" and not reported.stale
        # As the agent reports: nothing comes back, and the report is stored all the same.
        later = status.model_copy(update={"time": datetime.now(UTC), "loaded": []})
        await agent.send_status(later)
    async with admin(served) as registry:
        fleet = await registry.list_agents(base_model="tiny-llama")
        assert [a.agent_id for a in fleet.agents] == ["gpu-1"]
        assert fleet.agents[0].status.loaded == []
        rollout = await registry.rollout("bot", stale_after_s=600)
        (live,) = rollout.aliases
        assert live.converged and [e.agent_id for e in live.serving] == ["gpu-1"]


@pytest.mark.parametrize("large", [False, True], ids=["small", "over-1-MiB"])
async def test_an_unknown_adapter_is_refused_before_its_bytes_are_sent(
        served: Served, adapter_dir: Path, tmp_path: Path, large: bool) -> None:
    source = adapter_dir
    if large:  # never read: the check refuses the push before its files are hashed
        source = tmp_path / "large"
        source.mkdir()
        shutil.copy(adapter_dir / "adapter_config.json", source)
        with (source / "adapter_model.safetensors").open("wb") as out:
            out.truncate(CHECK_FIRST_ABOVE_BYTES + 1)
    sent: list[tuple[str, str]] = []

    async def note(request: httpx.Request) -> None:
        sent.append((request.method, request.url.path))

    async with admin(served) as registry:
        registry.http.event_hooks["request"].append(note)
        with pytest.raises(NotFound) as caught:
            await registry.push("nope", source, aliases=["live"])
        assert isinstance(caught.value, RegistryError) and not caught.value.retryable
        assert caught.value.code == "adapter_not_found"
    # A small adapter is refused by the upload itself (the registry checks the caller
    # and the adapter before it reads the body); a large one by a check first.
    assert sent == ([("GET", "/v1/adapters/nope")] if large
                    else [("POST", "/v1/adapters/nope/versions")])
