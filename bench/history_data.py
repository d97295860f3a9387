"""A registry's history after years of uploads, written straight into Postgres.

``--versions`` versions over ``--adapters`` adapters in upload order, the hot adapter
(``bench-hot``) holding 10% of them, interleaved with everyone else's (a seeded
shuffle). The aliases move as pushes and promotions would have moved them, in the same
order, so ``alias_moves`` ids follow time:

- every push moves the adapter's ``latest`` (``publish``);
- the hot adapter promotes every 10th version to ``live`` and every 4th to
  ``canary``, and every 20th ``live`` promotion is followed by a ``rollback``;
- every other adapter promotes every 50th version to ``live``.

At 1,000,000 versions that is about 1,050,000 moves: 100,000 on ``bench-hot/latest``,
about 10,500 on ``bench-hot/live`` and 18 on a typical adapter's ``live``.

Each version names two files whose digests follow from its id (``file_digests``), and
``version_blobs`` gets a row for each, as an upload writes them. ``write_blob_store``
lays out a local blob store (``registry_service/blobs/local.py``'s layout) holding an
empty file for every digest the versions name, plus unreferenced "orphan" blobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

TENANT = "bench"
BASE_MODEL = "meta-llama/Llama-3.1-8B"
HOT = "bench-hot"
TYPICAL = "bench-0002"
BATCH = 50_000
START = datetime(2024, 1, 1, tzinfo=UTC)
VERSION_COLUMNS = ("id", "adapter_id", "number", "digest", "files", "total_size", "rank",
                   "alpha", "target_modules", "uploader", "notes", "created_at")
MOVE_COLUMNS = ("id", "alias_id", "revision", "action", "from_version_id", "to_version_id",
                "actor", "created_at")
BLOB_COLUMNS = ("version_id", "sha256")
TARGETS_JSON = json.dumps(["q_proj", "k_proj", "v_proj", "o_proj"])
# (alias, every nth version of the hot adapter / of the others; 0: never)
PROMOTIONS = (("live", 10, 50), ("canary", 4, 0))
ROLLBACK_EVERY = 20  # hot adapter's live promotions


@dataclass
class AliasState:
    id: int
    adapter_id: int
    name: str
    version_id: int | None = None
    revision: int = 0
    promotions: int = 0
    history: list[int | None] = field(default_factory=list)


@dataclass
class Batch:
    versions: list[tuple[Any, ...]]
    moves: list[tuple[Any, ...]]
    blobs: list[tuple[int, str]] = field(default_factory=list)


class History:
    """The seeded registry: adapters, their aliases and the rows, generated lazily."""

    def __init__(self, versions: int, adapters: int, seed: int) -> None:
        self.versions = versions
        self.adapters = adapters
        self.hot_versions = max(1, versions // 10)
        others = adapters - 1
        if others < 1 or versions - self.hot_versions < others:
            raise ValueError("need at least 2 adapters and one version for each")
        base, extra = divmod(versions - self.hot_versions, others)
        self.counts = [self.hot_versions] + [base + (1 if i < extra else 0)
                                             for i in range(others)]
        self.names = [HOT] + [f"bench-{i:04d}" for i in range(1, adapters)]
        self.ids = list(range(1, adapters + 1))
        assign = np.repeat(np.array(self.ids), np.array(self.counts))
        np.random.default_rng(seed).shuffle(assign)
        self.assign: list[int] = assign.tolist()
        self.aliases: dict[tuple[int, str], AliasState] = {}
        for adapter_id in self.ids:
            for name in self._alias_names(adapter_id):
                self.aliases[(adapter_id, name)] = AliasState(len(self.aliases) + 1,
                                                              adapter_id, name)
        self.moves = 0

    @staticmethod
    def _alias_names(adapter_id: int) -> list[str]:
        return ["latest", "live", "canary"] if adapter_id == 1 else ["latest", "live"]

    def adapter_rows(self) -> list[tuple[Any, ...]]:
        return [(i, n, 1, BASE_MODEL, "", c, START, None)
                for i, n, c in zip(self.ids, self.names, self.counts, strict=True)]

    def alias_rows(self) -> list[tuple[Any, ...]]:
        """Every alias, pointing where the history left it."""
        return [(a.id, a.adapter_id, a.name, a.version_id, a.revision, START)
                for a in self.aliases.values()]

    def _move(self, alias: AliasState, action: str, to: int | None,
              at: datetime) -> tuple[Any, ...]:
        self.moves += 1
        alias.revision += 1
        row = (self.moves, alias.id, alias.revision, action, alias.version_id, to,
               "ci-publisher", at)
        alias.version_id = to
        return row

    def _moves_for(self, adapter_id: int, number: int, version_id: int,
                   at: datetime) -> Iterator[tuple[Any, ...]]:
        latest = self.aliases[(adapter_id, "latest")]
        yield self._move(latest, "publish", version_id, at)
        hot = adapter_id == 1
        for name, hot_every, other_every in PROMOTIONS:
            every = hot_every if hot else other_every
            if not every or number % every:
                continue
            alias = self.aliases[(adapter_id, name)]
            alias.history.append(alias.version_id)
            alias.promotions += 1
            yield self._move(alias, "promote", version_id, at + timedelta(seconds=1))
            if hot and name == "live" and alias.promotions % ROLLBACK_EVERY == 0:
                back = alias.history.pop()
                yield self._move(alias, "rollback", back, at + timedelta(seconds=2))

    def batches(self, size: int = BATCH) -> Iterator[Batch]:
        """Versions and alias moves in upload order, ``size`` uploads at a time."""
        counters: dict[int, int] = {}
        batch = Batch([], [])
        for i, adapter_id in enumerate(self.assign, start=1):
            number = counters.get(adapter_id, 0) + 1
            counters[adapter_id] = number
            at = START + timedelta(seconds=30 * i)
            digests = file_digests(i)
            batch.blobs.extend((i, sha) for sha in digests)
            batch.versions.append((i, adapter_id, number, secrets.token_hex(32),
                                   _files_json(i, digests), 33_555_244 + i % 4096, 16, 32.0,
                                   TARGETS_JSON, "ci-publisher", f"nightly fine-tune {number}",
                                   at))
            batch.moves.extend(self._moves_for(adapter_id, number, i, at))
            if len(batch.versions) == size:
                yield batch
                batch = Batch([], [])
        if batch.versions:
            yield batch

    def move_count(self, adapter: str, alias: str) -> int:
        return self.aliases[(self.names.index(adapter) + 1, alias)].revision


def file_digests(version_id: int) -> tuple[str, str]:
    """The sha256s of a version's config and weights: fixed by its id, so the store
    can be laid out apart from the database load."""
    return (hashlib.sha256(b"config %d" % version_id).hexdigest(),
            hashlib.sha256(b"weights %d" % version_id).hexdigest())


def orphan_digest(n: int) -> str:
    return hashlib.sha256(b"orphan %d" % n).hexdigest()


def _files_json(i: int, digests: tuple[str, str]) -> str:
    return json.dumps([
        {"name": "adapter_config.json", "size": 812, "sha256": digests[0]},
        {"name": "adapter_model.safetensors", "size": 33_554_432 + i % 4096,
         "sha256": digests[1]},
    ])


def referenced_digests(versions: int) -> Iterator[str]:
    for version_id in range(1, versions + 1):
        yield from file_digests(version_id)


def _touch_blobs(root: Path, digests: Iterable[str], mtime: float) -> int:
    # Plain os calls and str paths: two million files in a minute or two, not ten.
    base = os.path.join(root, "sha256")
    made: set[str] = set()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    count = 0
    for sha in digests:
        folder = f"{base}/{sha[0:2]}/{sha[2:4]}"
        if folder not in made:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            made.add(folder)
        fd = os.open(f"{folder}/{sha}", flags, 0o600)
        try:
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)
        count += 1
    return count


def write_blob_store(root: Path, versions: int, orphans: int, *,
                     age_s: float = 7 * 86400) -> tuple[int, int]:
    """A local blob store under ``root`` (the registry's ``<data_dir>/blobs``): an empty
    file for each digest the first ``versions`` versions name, and ``orphans`` files no
    version names, all written ``age_s`` ago (older than any grace). The collector never
    reads a blob's bytes. Returns (referenced, orphan) file counts."""
    os.makedirs(root, mode=0o700, exist_ok=True)
    mtime = datetime.now(UTC).timestamp() - age_s
    referenced = _touch_blobs(root, referenced_digests(versions), mtime)
    return referenced, _touch_blobs(root, (orphan_digest(n) for n in range(orphans)), mtime)


def store_census(root: Path, versions: int, orphans: int) -> dict[str, int]:
    """What the store holds now: how many of the versions' digests, how many of the
    orphans, and how many files besides (temporary files, strays)."""
    present: set[str] = set()
    for shard in os.scandir(os.path.join(root, "sha256")):
        for sub in os.scandir(shard.path):
            present.update(os.listdir(sub.path))
    referenced = sum(1 for sha in referenced_digests(versions) if sha in present)
    orphaned = sum(1 for n in range(orphans) if orphan_digest(n) in present)
    return {"referenced_present": referenced, "referenced_missing": 2 * versions - referenced,
            "orphans_present": orphaned, "other_files": len(present) - referenced - orphaned}


def _progress(done: int, total: int) -> None:
    print(f"  wrote {done:,}/{total:,} versions", file=sys.stderr)


async def load_postgres(url: str, history: History) -> None:
    """COPY the history into a migrated, empty database, then VACUUM (ANALYZE)."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute("INSERT INTO tenants (id, name, created_at) VALUES (1, $1, $2)",
                               TENANT, START)
            await conn.copy_records_to_table(
                "adapters", records=history.adapter_rows(),
                columns=["id", "name", "tenant_id", "base_model", "description",
                         "last_version", "created_at", "deleted_at"])
            # Aliases first (the moves point at them), where they end up after the moves.
            await conn.copy_records_to_table(
                "aliases", records=[(a.id, a.adapter_id, a.name, None, 0, START)
                                    for a in history.aliases.values()],
                columns=["id", "adapter_id", "name", "version_id", "revision", "updated_at"])
            done = 0
            for batch in history.batches():
                await conn.copy_records_to_table("versions", records=batch.versions,
                                                 columns=list(VERSION_COLUMNS))
                await conn.copy_records_to_table("alias_moves", records=batch.moves,
                                                 columns=list(MOVE_COLUMNS))
                await conn.copy_records_to_table("version_blobs", records=batch.blobs,
                                                 columns=list(BLOB_COLUMNS))
                done += len(batch.versions)
                _progress(done, history.versions)
            await conn.executemany(
                "UPDATE aliases SET version_id = $2, revision = $3 WHERE id = $1",
                [(a.id, a.version_id, a.revision) for a in history.aliases.values()])
            for table_name in ("tenants", "adapters", "versions", "aliases", "alias_moves"):
                await conn.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table_name}', 'id'), "
                    f"(SELECT max(id) FROM {table_name}))")
        for table_name in ("versions", "adapters", "aliases", "alias_moves", "version_blobs"):
            await conn.execute(f"VACUUM (ANALYZE) {table_name}")
    finally:
        await conn.close()


async def migrate_fresh(async_url: str) -> None:
    """Bring the empty database at ``async_url`` to the registry's newest schema."""
    from registry_service.db import migrate  # noqa: PLC0415
    from registry_service.db.engine import Database  # noqa: PLC0415

    db = Database(async_url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.close()
