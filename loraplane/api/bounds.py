"""The ranges of the integers the API accepts: those the registry's columns hold.

A number past them would overflow the database driver (a 500 instead of a 4xx), so
every integer in a path, a query, a body or a cursor is checked against these first.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# Versions, revisions and ids are 32-bit integer columns on Postgres.
INT32_MAX = 2**31 - 1
# Event sequence numbers are 64-bit.
INT64_MAX = 2**63 - 1

VersionNumber = Annotated[int, Field(ge=1, le=INT32_MAX)]
Revision = Annotated[int, Field(ge=0, le=INT32_MAX)]


def parse_bounded(text: str, *, low: int, high: int) -> int | None:
    """``text`` as a decimal integer in ``[low, high]``, or None.

    ``str.isdigit`` accepts digits ``int`` refuses (``"²"``), so only ASCII digits pass.
    """
    if not text.isascii() or not text.isdigit() or len(text) > len(str(high)):
        return None
    value = int(text)
    return value if low <= value <= high else None
