"""Materializer: real adapter files, verification, validation codes, atomicity, disk LRU."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path

import pytest

from devharness.adapters import make_adapter, make_base_config
from devharness.waiting import eventually
from inference_agent.errors import AdapterRejected, FetchFailed, TerminalError
from inference_agent.metrics import AgentMetrics
from inference_agent.node import materialize
from inference_agent.node.materialize import STAGING, CachedFolder, Materializer
from loraplane.events import FileRef
from loraplane.lora import BaseModelShapes
from tests.agent.adapter_refs import LocalFetch, adapter_ref, ref_from_dir


def materializer(root: Path, fetch: LocalFetch | None, *, max_bytes: int = 10**9,
                 shapes: BaseModelShapes | None = None, max_rank: int = 16) -> Materializer:
    return Materializer(root / "cache", max_bytes=max_bytes, fetch=fetch, base_shapes=shapes,
                        max_rank=max_rank, metrics=AgentMetrics())


def leftovers(root: Path) -> list[Path]:
    staging = root / "cache" / STAGING
    return list(staging.iterdir()) if staging.exists() else []


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def write_half(file: FileRef, dest: Path) -> None:
    dest.write_bytes(Path(file.url).read_bytes()[: file.size // 2])


def tiny_llama_shapes(root: Path) -> BaseModelShapes:
    root.mkdir(parents=True, exist_ok=True)
    return BaseModelShapes.from_hf_config(make_base_config(root))


async def test_materialize_fetches_verifies_and_is_idempotent(tmp_path: Path) -> None:
    fetch = LocalFetch()
    mat = materializer(tmp_path, fetch, shapes=tiny_llama_shapes(tmp_path / "base"))
    ref = adapter_ref(tmp_path, "bot", 3)
    folder = await mat.materialize(ref)
    assert folder == tmp_path / "cache" / "bot" / f"3-{ref.digest[:12]}"
    assert sorted(p.name for p in folder.iterdir()) == [f.name for f in ref.files]
    assert mat.path_of(ref) == folder
    assert await mat.materialize(ref) == folder
    assert len(fetch.calls) == 2 and leftovers(tmp_path) == []


async def test_concurrent_materialize_of_one_version_fetches_once(tmp_path: Path) -> None:
    fetch = LocalFetch()
    fetch.gate = asyncio.Event()
    mat = materializer(tmp_path, fetch)
    ref = adapter_ref(tmp_path, "bot", 1)
    tasks = [asyncio.create_task(mat.materialize(ref)) for _ in range(4)]
    # The four took their first step in one loop turn: one holds the fetch open, the
    # others are parked on its lock (without it they would have fetched too by now).
    await eventually(lambda: len(fetch.calls) >= 1, what="first fetch")
    assert len(fetch.calls) == 1 and not any(task.done() for task in tasks)
    fetch.gate.set()
    assert len(set(await asyncio.gather(*tasks))) == 1
    assert len(fetch.calls) == 2


async def test_a_sha256_mismatch_is_a_retryable_fetch_failure(tmp_path: Path) -> None:
    mat = materializer(tmp_path, LocalFetch())
    ref = adapter_ref(tmp_path, "bot", 1)
    flip_last_byte(Path(ref.files[1].url))  # same size, different content
    with pytest.raises(FetchFailed, match="sha256") as info:
        await mat.materialize(ref)
    assert info.value.retryable
    assert mat.path_of(ref) is None and leftovers(tmp_path) == []


async def test_a_digest_mismatch_is_rejected(tmp_path: Path) -> None:
    mat = materializer(tmp_path, LocalFetch())
    folder = make_adapter(tmp_path / "src")
    ref = ref_from_dir("bot", 1, folder, digest="0" * 64)
    with pytest.raises(AdapterRejected) as info:
        await mat.materialize(ref)
    assert info.value.code == "digest_mismatch" and not info.value.retryable
    assert mat.path_of(ref) is None and leftovers(tmp_path) == []


async def test_rank_above_max_is_refused_before_any_download(tmp_path: Path) -> None:
    fetch = LocalFetch()
    mat = materializer(tmp_path, fetch, max_rank=16)
    ref = ref_from_dir("bot", 1, make_adapter(tmp_path / "src", rank=32), rank=32)
    with pytest.raises(AdapterRejected, match="32") as info:
        await mat.materialize(ref)
    assert info.value.code == "rank_too_large" and fetch.calls == []


async def test_rank_is_checked_in_the_files_too(tmp_path: Path) -> None:
    # Metadata claiming rank 8 for a rank-32 adapter: the files' config decides.
    mat = materializer(tmp_path, LocalFetch(), max_rank=16)
    ref = ref_from_dir("bot", 1, make_adapter(tmp_path / "src", rank=32), rank=8)
    with pytest.raises(AdapterRejected) as info:
        await mat.materialize(ref)
    assert info.value.code == "rank_too_large"
    assert mat.path_of(ref) is None and leftovers(tmp_path) == []


@pytest.mark.parametrize("hidden", [64, 256])
async def test_an_adapter_for_another_base_model_is_rejected(tmp_path: Path,
                                                             hidden: int) -> None:
    mat = materializer(tmp_path, LocalFetch(), shapes=tiny_llama_shapes(tmp_path / "base"))
    folder = make_adapter(tmp_path / "src", hidden=hidden, intermediate=2 * hidden)
    ref = ref_from_dir("bot", 1, folder)
    with pytest.raises(AdapterRejected, match="features") as info:
        await mat.materialize(ref)
    assert info.value.code == "shape_mismatch"
    assert mat.path_of(ref) is None and leftovers(tmp_path) == []


async def test_nan_values_are_rejected(tmp_path: Path) -> None:
    mat = materializer(tmp_path, LocalFetch())
    ref = ref_from_dir("bot", 1, make_adapter(tmp_path / "src", inject="nan"))
    with pytest.raises(AdapterRejected) as info:
        await mat.materialize(ref)
    assert info.value.code == "non_finite_values"


@pytest.mark.parametrize("inline", [True, False], ids=["on the loop", "in a thread"])
async def test_small_versions_are_checked_on_the_loop_large_ones_in_a_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inline: bool) -> None:
    # The adapters here are ~70 KB: a limit of 0 sends every check to a worker thread.
    monkeypatch.setattr(materialize, "INLINE_CHECK_BYTES", 1 << 20 if inline else 0)
    threads: list[int] = []
    check = Materializer._check

    def watched(self: Materializer, *args: object) -> None:
        threads.append(threading.get_ident())
        check(self, *args)  # type: ignore[arg-type]
    monkeypatch.setattr(Materializer, "_check", watched)
    mat = materializer(tmp_path, LocalFetch())
    bad = ref_from_dir("bot", 1, make_adapter(tmp_path / "nan", inject="nan"))
    with pytest.raises(AdapterRejected) as info:
        await mat.materialize(bad)
    assert info.value.code == "non_finite_values" and leftovers(tmp_path) == []
    good = ref_from_dir("bot", 2, make_adapter(tmp_path / "good"))
    assert await mat.materialize(good) == mat.path_of(good)
    on_loop = threading.get_ident()
    assert len(threads) == 2
    assert (set(threads) == {on_loop}) if inline else (on_loop not in threads)


async def test_unsafe_file_names_are_refused(tmp_path: Path) -> None:
    mat = materializer(tmp_path, LocalFetch())
    good = adapter_ref(tmp_path, "bot", 1)
    # The schema refuses such a name; built unchecked, the materializer refuses it too.
    evil = FileRef.model_construct(name="../../evil", size=1, sha256="0" * 64,
                                   url="/dev/null")
    ref = good.model_copy(update={"files": [*good.files, evil]})
    with pytest.raises(AdapterRejected) as info:
        await mat.materialize(ref)
    assert info.value.code == "unsafe_file_name"


class BreakingFetch(LocalFetch):
    """Writes half of the second file, then fails (or blocks, to be cancelled)."""

    def __init__(self, block: bool = False) -> None:
        super().__init__()
        self.block = block
        self.blocked = asyncio.Event()

    async def __call__(self, file: FileRef, dest: Path) -> tuple[int, str]:
        if self.calls:
            write_half(file, dest)
            if self.block:
                self.blocked.set()
                await asyncio.Event().wait()  # until cancelled
            raise FetchFailed("connection reset")
        return await super().__call__(file, dest)


@pytest.mark.parametrize("block", [False, True])
async def test_a_broken_fetch_leaves_no_partial_folder(tmp_path: Path, block: bool) -> None:
    fetch = BreakingFetch(block)
    mat = materializer(tmp_path, fetch)
    ref = adapter_ref(tmp_path, "bot", 1)
    task = asyncio.create_task(mat.materialize(ref))
    if block:
        await asyncio.wait_for(fetch.blocked.wait(), 5)
        assert leftovers(tmp_path)  # the half-written staging folder exists meanwhile
        task.cancel()
    with pytest.raises(FetchFailed if not block else asyncio.CancelledError):
        await task
    assert mat.path_of(ref) is None and leftovers(tmp_path) == []
    assert not (tmp_path / "cache" / "bot").exists()


async def test_staging_leftovers_of_a_crash_are_removed_at_start(tmp_path: Path) -> None:
    crashed = tmp_path / "cache" / STAGING / "bot-1-dead"
    crashed.mkdir(parents=True)
    (crashed / "adapter_config.json").write_text("{")
    materializer(tmp_path, None)
    assert leftovers(tmp_path) == []


async def test_without_a_fetch_only_local_versions_are_served(tmp_path: Path) -> None:
    mat = materializer(tmp_path, None)
    ref = adapter_ref(tmp_path, "bot", 1)
    with pytest.raises(TerminalError) as info:
        await mat.materialize(ref)
    assert info.value.code == "no_source"
    source = Path(ref.files[0].url).parent
    folder = await mat.add_local(ref, source)
    assert await mat.materialize(ref) == folder
    shutil.rmtree(folder)
    (source / "adapter_config.json").write_text("{}")  # changed after the ref was made
    with pytest.raises(FetchFailed):
        await mat.add_local(ref, source)
    assert mat.path_of(ref) is None and leftovers(tmp_path) == []


async def test_disk_eviction_is_lru_and_never_removes_kept_versions(tmp_path: Path) -> None:
    mat = materializer(tmp_path, LocalFetch())
    refs = [adapter_ref(tmp_path, "bot", n) for n in (1, 2, 3, 4)]
    folders = [await mat.materialize(ref) for ref in refs]
    size = sum(p.stat().st_size for p in folders[0].iterdir())
    for age, folder in enumerate(folders):  # bot@1 oldest ... bot@4 newest
        os.utime(folder, (1_000_000 + age, 1_000_000 + age))
    await mat.materialize(refs[1])  # a hit refreshes bot@2
    mat.max_bytes = 2 * size
    await mat.evict_disk(keep={"bot@1"})
    assert [mat.path_of(r) is not None for r in refs] == [True, True, False, False]
    mat.max_bytes = 1
    await mat.evict_disk(keep={"bot@1", "bot@2"})  # over budget, but both are kept
    assert [mat.path_of(r) is not None for r in refs] == [True, True, False, False]
    await mat.evict_disk(keep=set())
    assert all(mat.path_of(r) is None for r in refs)
    assert not (tmp_path / "cache" / "bot").exists()


async def test_fetch_and_validate_stages_are_timed(tmp_path: Path) -> None:
    metrics = AgentMetrics()
    mat = Materializer(tmp_path / "cache", max_bytes=10**9, fetch=LocalFetch(),
                       base_shapes=None, max_rank=16, metrics=metrics)
    await mat.materialize(adapter_ref(tmp_path, "bot", 1))
    registry = metrics.registry
    for stage in ("fetch", "validate"):
        assert registry.get_sample_value("loraplane_agent_stage_seconds_count",
                                         {"stage": stage}) == 1


async def test_an_adapter_folder_removed_before_the_rename_is_made_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The disk cache's eviction (a worker thread) removes empty adapter folders: here it
    # wins the race once, between the build's mkdir and its rename.
    fetch = LocalFetch()
    mat = materializer(tmp_path, fetch)
    ref = adapter_ref(tmp_path, "bot", 1)
    rename = os.rename
    raced: list[Path] = []

    def racing(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if not raced:
            raced.append(Path(dst).parent)
            Path(dst).parent.rmdir()
        rename(src, dst)

    monkeypatch.setattr(os, "rename", racing)
    folder = await mat.materialize(ref)
    assert raced == [folder.parent] and mat.path_of(ref) == folder
    assert len(fetch.calls) == len(ref.files), "built once, not fetched again"
    assert leftovers(tmp_path) == []


async def test_eviction_under_budget_walks_nothing_until_a_build_crosses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mat = materializer(tmp_path, LocalFetch())
    walks: list[int] = []
    walk = mat.cached

    def counted() -> list[CachedFolder]:
        walks.append(1)
        return walk()

    monkeypatch.setattr(mat, "cached", counted)
    refs = [adapter_ref(tmp_path, "bot", n) for n in (1, 2, 3)]
    folders = [await mat.materialize(ref) for ref in refs[:2]]
    for age, folder in enumerate(folders):  # bot@1 older than bot@2
        os.utime(folder, (1_000_000 + age, 1_000_000 + age))
    size = sum(p.stat().st_size for p in folders[0].iterdir())
    await mat.evict_disk(keep=set())  # the first call counts what is on disk
    await mat.evict_disk(keep=set())
    await mat.evict_disk(keep=set())
    assert len(walks) == 1
    mat.max_bytes = 2 * size + size // 2  # room for two folders, not three
    await mat.materialize(refs[2])  # the running count crosses the budget: walk, evict
    await mat.evict_disk(keep={"bot@3"})
    assert len(walks) == 2
    assert [mat.path_of(r) is not None for r in refs] == [False, True, True]


async def test_a_recount_sees_what_changed_on_disk_by_other_hands(tmp_path: Path) -> None:
    mat = materializer(tmp_path, LocalFetch())
    folder = await mat.materialize(adapter_ref(tmp_path, "bot", 1))
    await mat.evict_disk(keep=set())
    shutil.copytree(folder, folder.parent / "2-added-by-hand")  # the count misses it
    mat.max_bytes = sum(p.stat().st_size for p in folder.iterdir())
    await mat.evict_disk(keep={"bot@2"})  # by the running count: under budget
    assert mat.path_of(adapter_ref(tmp_path, "bot", 1)) is not None
    await mat.evict_disk(keep={"bot@2"}, recount=True)  # counted: over budget, bot@1 goes
    assert mat.path_of(adapter_ref(tmp_path, "bot", 1)) is None


async def test_a_folder_built_while_a_walk_runs_stays_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mat = materializer(tmp_path, LocalFetch())
    refs = [adapter_ref(tmp_path, "bot", n) for n in (1, 2, 3)]
    folders = [await mat.materialize(ref) for ref in refs[:2]]
    for age, folder in enumerate(folders):  # bot@1 older than bot@2
        os.utime(folder, (1_000_000 + age, 1_000_000 + age))
    size = sum(p.stat().st_size for p in folders[0].iterdir())
    mat.max_bytes = 2 * size + size // 2  # room for two folders, not three
    listed, release = threading.Event(), threading.Event()
    walk = mat.cached

    def slow_walk() -> list[CachedFolder]:
        found = walk()
        listed.set()
        release.wait(30)
        return found

    monkeypatch.setattr(mat, "cached", slow_walk)
    walking = asyncio.create_task(mat.evict_disk(keep=set(), recount=True))
    await eventually(listed.is_set, timeout_s=30, what="the walk's listing")
    await mat.materialize(refs[2])  # after the listing: the walk does not see it
    release.set()
    await walking
    monkeypatch.setattr(mat, "cached", walk)
    # The count holds three folders, over budget: the oldest goes without a recount.
    await mat.evict_disk(keep={"bot@3"})
    assert [mat.path_of(r) is not None for r in refs] == [False, True, True]
