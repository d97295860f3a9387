"""The cursor of a keyset page: the key below which the next page starts."""

from __future__ import annotations

from loraplane.api.bounds import INT32_MAX, parse_bounded
from registry_service.errors import BadRequest


def int_cursor(cursor: str | None) -> int | None:
    """``cursor`` as a positive 32-bit key, None for the first page; 400
    ``invalid_cursor`` for anything else."""
    if cursor is None:
        return None
    before = parse_bounded(cursor, low=1, high=INT32_MAX)
    if before is None:
        raise BadRequest("the cursor is not valid", code="invalid_cursor")
    return before
