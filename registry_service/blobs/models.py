from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
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
