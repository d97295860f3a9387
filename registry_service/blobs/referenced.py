"""The digests that versions name, read for the blob collector without stalling the
registry.

A registry with a million versions names about two million files. Reading every
version's ``files`` JSON in one query and decoding it in Python blocked the event loop
for minutes (``/readyz`` went unanswered for 330 s at start-up), held SQLite's write
lock for the whole read (every SQLite transaction takes it at ``BEGIN``), and a set of
two million hex strings takes about 300 MB. So the database extracts the digests itself,
a page of versions at a time, each page in a transaction of its own, the event loop
runs between pages, and the digests are kept as sorted 64-bit prefixes (8 bytes each,
in an ``array``: numpy, which did this before, cost every registry 11 MiB of RSS).

A prefix match keeps a blob: at worst an unreferenced blob whose first 16 hex digits
equal a referenced one's survives a pass. A blob whose prefix is not found is checked
again, in full, in the transaction that claims it (``gc._is_referenced``).
"""

from __future__ import annotations

import asyncio
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.db.engine import Database

PAGE_VERSIONS = 5000

# One page of versions by id, and the sha256 of each file each of them names.
_PAGE_SQL = {
    "postgresql": (
        "SELECT v.id, f.value ->> 'sha256' FROM "
        "(SELECT id, files FROM versions WHERE id > :after ORDER BY id LIMIT :n) AS v "
        "LEFT JOIN LATERAL json_array_elements(v.files::json) AS f(value) ON true"
    ),
    "sqlite": (
        "SELECT v.id, json_extract(f.value, '$.sha256') FROM "
        "(SELECT id, files FROM versions WHERE id > :after ORDER BY id LIMIT :n) AS v "
        "LEFT JOIN json_each(v.files) AS f"
    ),
}


def _prefix(sha256: str) -> int:
    return int(sha256[:16], 16)


class _ByTopByte:
    """Prefixes gathered in 256 buckets by their top byte, 8 bytes each.

    sha256 spreads them evenly, so each bucket is sorted on its own: sorting two million
    prefixes as one list of ints took 100 MiB more than the array they end in.
    """

    def __init__(self) -> None:
        self._buckets = [array("Q") for _ in range(256)]

    def add(self, prefixes: Iterable[int]) -> None:
        for prefix in prefixes:
            self._buckets[prefix >> 56].append(prefix)

    def sorted_parts(self) -> Iterator[array[int]]:
        """Each bucket sorted and without repeats, in order; each is let go once given."""
        for index, bucket in enumerate(self._buckets):
            self._buckets[index] = array("Q")
            yield array("Q", sorted(set(bucket)))


class ReferencedDigests:
    """Sorted, distinct 64-bit prefixes of every digest a version names."""

    def __init__(self, prefixes: array[int]) -> None:
        """``prefixes`` sorted and distinct, as ``_ByTopByte.sorted_parts`` make them."""
        self._prefixes = prefixes

    @classmethod
    def of(cls, prefixes: Iterable[int]) -> ReferencedDigests:
        gathered = _ByTopByte()
        gathered.add(prefixes)
        merged = array("Q")
        for part in gathered.sorted_parts():
            merged.extend(part)
        return cls(merged)

    def __len__(self) -> int:
        return len(self._prefixes)

    def __contains__(self, sha256: object) -> bool:
        if not isinstance(sha256, str):
            return False
        try:
            key = _prefix(sha256)
        except ValueError:  # not a hex digest: no version names it
            return False
        at = bisect_left(self._prefixes, key)
        return at < len(self._prefixes) and self._prefixes[at] == key


async def _page(session: AsyncSession, after: int) -> tuple[int | None, list[int]]:
    """The last version id of the page after ``after`` (None past the end), and the
    prefixes of the digests its versions name."""
    dialect = session.get_bind().dialect.name
    rows = (await session.execute(text(_PAGE_SQL[dialect]),
                                  {"after": after, "n": PAGE_VERSIONS})).all()
    if not rows:
        return None, []
    return max(row[0] for row in rows), [_prefix(row[1]) for row in rows if row[1]]


async def read_referenced(db: Database) -> ReferencedDigests:
    gathered = _ByTopByte()
    after: int | None = 0
    while after is not None:
        async with db.session() as session:
            after, prefixes = await _page(session, after)
        gathered.add(prefixes)
        await asyncio.sleep(0)  # let requests in between pages
    merged = array("Q")
    for part in gathered.sorted_parts():
        merged.extend(part)
        await asyncio.sleep(0)  # and between buckets
    return ReferencedDigests(merged)
