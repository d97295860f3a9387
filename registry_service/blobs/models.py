"""Blob bookkeeping in the database: upload leases (``blob_leases``) and the blobs each
version names (``version_blobs``)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from registry_service.db.base import Base, UTCDateTime


class BlobLease(Base):
    """Who may not lose a blob right now, and whether the collector is removing it.

    An upload leases the blobs it is about to store and reference before it stores them
    (``holders`` counts the uploads, ``held_until`` bounds the lease of one that dies);
    the collector takes an unreferenced blob only when no upload holds it or the lease
    has run out, and marks the row (``collecting_until``) while it deletes the blob, so an upload
    of the same bytes waits for the deletion instead of counting on a blob that is going.
    """

    __tablename__ = "blob_leases"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    held_until: Mapped[datetime] = mapped_column(UTCDateTime())
    holders: Mapped[int] = mapped_column(Integer, default=0)
    collecting_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)


class VersionBlob(Base):
    """A blob a version names: one row per distinct digest of a version's ``files``.

    Written in the transaction that creates the version, and never changed after
    (versions are never deleted), so the collector asks this table, by an indexed probe,
    whether anything names a blob instead of reading every version's files. The key
    leads with the digest for that probe.
    """

    __tablename__ = "version_blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"), primary_key=True)


def version_blobs(version_id: int, digests: Iterable[str]) -> list[VersionBlob]:
    """The rows of a new version that names ``digests`` (repeats count once)."""
    return [VersionBlob(sha256=sha, version_id=version_id) for sha in sorted(set(digests))]
