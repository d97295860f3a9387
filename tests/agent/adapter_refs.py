"""VersionRefs for adapter folders on disk, a local fetch, and a narrow fake vLLM."""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from pathlib import Path

from devharness.adapters import make_adapter
from inference_agent.errors import VllmRefused, VllmUnavailable
from inference_agent.serving.leases import Leases
from loraplane.digest import sha256_file, version_digest
from loraplane.events import FileRef, VersionRef


def ref_from_dir(adapter: str, version: int, folder: Path, *, rank: int = 8,
                 base_model: str = "tiny-llama", digest: str | None = None) -> VersionRef:
    """A ref whose file URLs are the files' absolute paths (for ``LocalFetch``)."""
    files = []
    for path in sorted(folder.iterdir()):
        size, sha = sha256_file(path)
        files.append(FileRef(name=path.name, size=size, sha256=sha, url=str(path)))
    return VersionRef(
        adapter=adapter, version=version,
        digest=digest or version_digest((f.name, f.size, f.sha256) for f in files),
        base_model=base_model, rank=rank, alpha=16.0, target_modules=["q_proj", "v_proj"],
        files=files)


def adapter_ref(root: Path, adapter: str, version: int, **make: object) -> VersionRef:
    folder = make_adapter(root / f"src-{adapter}-{version}", seed=version, **make)  # type: ignore[arg-type]
    return ref_from_dir(adapter, version, folder)


class LocalFetch:
    """A Materializer fetch that copies ``file.url`` (a local path); counts calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, file: FileRef, dest: Path) -> tuple[int, str]:
        self.calls.append(file.url)
        if self.gate is not None:
            await self.gate.wait()
        shutil.copyfile(file.url, dest)
        return sha256_file(dest)  # what was written, as the real fetchers report it


def is_dir(path: Path) -> bool:
    return path.is_dir()


class FakeVllm:
    """The VllmClient surface the cache uses, with gates to hold loads and unloads open."""

    def __init__(self) -> None:
        self.names: dict[str, Path] = {}
        self.load_calls: list[str] = []
        self.unload_calls: list[str] = []
        self.gate: asyncio.Event | None = None
        self.unload_gate: asyncio.Event | None = None
        self.refuse: set[str] = set()
        self.down = False

    async def loaded(self) -> set[str]:
        if self.down:
            raise VllmUnavailable("down")
        return set(self.names)

    async def load(self, name: str, path: Path) -> None:
        self.load_calls.append(name)
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise VllmUnavailable("down")
        if name in self.refuse:
            raise VllmRefused(f"refused {name}")
        assert is_dir(path), path
        self.names[name] = path

    async def unload(self, name: str) -> None:
        self.unload_calls.append(name)
        if self.unload_gate is not None:
            await self.unload_gate.wait()
        if self.down:
            raise VllmUnavailable("down")
        self.names.pop(name, None)


class WatchedLeases(Leases):
    """Real leases that record the waits on them: a test can tell that a drain or a load
    is parked on a lease (and with which timeout), rather than guess how long that takes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.idle_waits: list[tuple[str, float]] = []
        self.waiting: Counter[str] = Counter()  # names with a wait_idle not yet returned
        self.any_idle_waits = 0

    async def wait_idle(self, name: str, timeout_s: float) -> bool:
        self.idle_waits.append((name, timeout_s))
        self.waiting[name] += 1
        try:
            return await super().wait_idle(name, timeout_s)
        finally:
            self.waiting[name] -= 1

    async def wait_any_idle(self, timeout_s: float) -> bool:
        self.any_idle_waits += 1
        return await super().wait_any_idle(timeout_s)

