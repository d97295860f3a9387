"""Tiers: each version's hot / warm / cold on this agent, and the transitions counted in
the metrics the agent serves at /metrics (rendered and parsed, as a scrape would)."""

from __future__ import annotations

from pathlib import Path

from devharness.testbed import metric
from inference_agent.node.materialize import STAGING, _versions_in
from inference_agent.node.status import tier_entries
from inference_agent.serving.routes import RouteTable
from loraplane.events import TierEntry
from tests.agent.adapter_refs import adapter_ref
from tests.agent.node.test_cache import World

TRANSITIONS = "loraplane_agent_tier_transitions_total"
SECONDS = "loraplane_agent_tier_transition_seconds_count"


def _moved(world: World, source: str, target: str) -> float:
    text = world.metrics.render().decode()
    return metric(text, TRANSITIONS, **{"from": source, "to": target})


async def test_transitions_are_counted_and_timed(tmp_path: Path) -> None:
    world = World(tmp_path, capacity=1)
    a, b = world.ref("a"), world.ref("b")
    await world.cache.ensure_active(a)  # cold -> warm (download) -> hot (load)
    assert (_moved(world, "cold", "warm"), _moved(world, "warm", "hot")) == (1, 1)
    await world.cache.ensure_active(b)  # a evicted: hot -> warm; b cold -> warm -> hot
    assert _moved(world, "hot", "warm") == 1
    assert (_moved(world, "cold", "warm"), _moved(world, "warm", "hot")) == (2, 2)
    await world.cache.ensure_active(a)  # a was still on disk: warm -> hot, no download
    assert (_moved(world, "cold", "warm"), _moved(world, "warm", "hot")) == (2, 3)
    world.materializer.max_bytes = 0
    await world.materializer.evict_disk(keep={"a@1"})  # b leaves the disk: warm -> cold
    assert _moved(world, "warm", "cold") == 1
    text = world.metrics.render().decode()
    assert metric(text, SECONDS, **{"from": "warm", "to": "hot"}) == 3
    assert world.materializer.on_disk() == {("a", 1)}


def test_each_version_reports_its_tier_and_ownership(tmp_path: Path) -> None:
    routes = RouteTable("tiny-llama")
    routes.set_alias("bot", "live", 1, adapter_ref(tmp_path, "bot", 3))
    routes.set_alias("cold", "live", 1, adapter_ref(tmp_path, "cold", 1))
    entries = tier_entries(routes=routes, loaded=["bot@3"],
                           on_disk={("bot", 3), ("bot", 2), ("cold", 0)}, owned={"bot"})
    assert [(e.adapter, e.version, e.tier, e.owned) for e in entries] == [
        ("bot", 2, "warm", True), ("bot", 3, "hot", True),
        ("cold", 0, "warm", False), ("cold", 1, "cold", False)]


def test_the_warm_tier_is_read_from_folder_names_only(tmp_path: Path) -> None:
    """``on_disk`` lists ``<adapter>/<N>-<digest>`` folders: not files, not the staging
    area, not other names; an adapter folder evicted while it is read counts as none."""
    world = World(tmp_path, capacity=1)
    cache = world.materializer.cache_dir
    for path in ("bot/1-aa", "bot/12-bb", "bot/x-cc", "other/3-dd", f"{STAGING}/4-ee"):
        (cache / path).mkdir(parents=True)
    (cache / "bot" / "5-ff").write_text("a file, not a version")
    (cache / "stray-file").write_text("")
    assert world.materializer.on_disk() == {("bot", 1), ("bot", 12), ("other", 3)}
    assert _versions_in(str(cache / "evicted-meanwhile")) == []


async def test_the_warm_tier_follows_builds_and_is_listed_again_after_an_eviction(
        tmp_path: Path) -> None:
    """Listed once; a version built here joins the list without a listing; a folder
    that appears or goes otherwise shows after the next eviction, which lists again."""
    world = World(tmp_path, capacity=1)
    materializer, cache = world.materializer, world.materializer.cache_dir
    (cache / "by-hand" / "1-aa").mkdir(parents=True)
    assert materializer.on_disk() == {("by-hand", 1)}
    (cache / "by-hand" / "2-bb").mkdir()  # behind the agent's back: not seen yet
    await materializer.materialize(world.ref("a"))
    assert materializer.on_disk() == {("by-hand", 1), ("a", 1)}
    await materializer.evict_disk(keep=set())  # its first walk: nothing over budget
    assert materializer.on_disk() == {("by-hand", 1), ("by-hand", 2), ("a", 1)}
    materializer.max_bytes = 0
    await materializer.evict_disk(keep={"by-hand@1", "by-hand@2"})
    assert materializer.on_disk() == {("by-hand", 1), ("by-hand", 2)}


def test_a_report_shares_the_entries_an_earlier_one_listed(tmp_path: Path) -> None:
    routes = RouteTable("tiny-llama")
    routes.set_alias("bot", "live", 1, adapter_ref(tmp_path, "bot", 3))

    def entries() -> list[object]:
        return list(tier_entries(routes=routes, loaded=["bot@3"], on_disk={("bot", 2)},
                                 owned={"bot"}))

    first, second = entries(), entries()
    assert len(first) == 2 and all(a is b for a, b in zip(first, second, strict=True))
    routes.set_alias("bot", "live", 2, adapter_ref(tmp_path, "bot", 4))
    moved = entries()  # bot@4 routed, still cold: one new entry, the others shared
    assert moved[:2] == first and all(a is b for a, b in zip(moved, first, strict=False))
    assert moved[2] == TierEntry(adapter="bot", version=4, tier="cold", owned=True)
