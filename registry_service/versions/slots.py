"""How many uploads each token has in flight on this registry process.

An upload holds its slot from before its body is read until it is answered, whatever
the outcome (stored, refused, the client gone). The count lives in this process: each
replica of a registry counts its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from registry_service.errors import TooManyRequests


class UploadSlots:
    def __init__(self) -> None:
        self._held: dict[int, int] = {}

    def in_flight(self, token_id: int | None = None) -> int:
        """Uploads in flight for ``token_id``, or for every token."""
        if token_id is None:
            return sum(self._held.values())
        return self._held.get(token_id, 0)

    @contextmanager
    def hold(self, token_id: int, limit: int) -> Iterator[None]:
        """A slot of ``token_id``'s, or 429 ``too_many_uploads`` when all ``limit`` are taken.

        The event loop is single-threaded and nothing awaits between the check and the
        count, so no lock is needed.
        """
        held = self.in_flight(token_id)
        if held >= limit:
            raise TooManyRequests(
                f"this token already has {held} uploads in flight; retry when one is done",
                code="too_many_uploads", detail={"in_flight": held, "limit": limit})
        self._held[token_id] = held + 1
        try:
            yield
        finally:
            left = self._held[token_id] - 1
            if left:
                self._held[token_id] = left
            else:
                del self._held[token_id]
