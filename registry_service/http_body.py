"""uvicorn's httptools protocol, handing request bodies over without copying them.

uvicorn gathers the body chunks of a request into a ``bytearray`` and makes ``bytes`` of
it for every ``receive()``: two copies of every uploaded byte, made in the event loop
with the GIL held (on_body alone was 13% of the registry's GIL-held samples during a
1 GiB upload; docs/benchmarks.md, upload section). Here the request's ``body`` keeps the
chunks as they came, and ``bytes()`` of it is that chunk itself when one arrived between
two reads, as is usual, or one join of them otherwise.

Only the attribute and the three operations uvicorn applies to it are relied on
(``+=``, ``len()``, ``bytes()``); tests/registry/test_http_body.py runs a real server.
"""

from __future__ import annotations

from loraplane.http_guard import GuardedProtocol


class Chunks:
    """Body chunks not yet received by the application, kept as they came."""

    __slots__ = ("_pieces", "_size")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._size = 0

    def __iadd__(self, data: bytes) -> Chunks:
        self._pieces.append(data)
        self._size += len(data)
        return self

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        # bytes.join of a single bytes object returns that object: no copy.
        return b"".join(self._pieces)


class UncopiedBodyProtocol(GuardedProtocol):
    """uvicorn's ``HttpToolsProtocol`` whose requests keep their body chunks in
    ``Chunks``, and whose connections keep to ``loraplane.http_guard``'s header timeout
    and connection cap."""

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if not isinstance(cycle.body, Chunks):
            # Each receive() leaves a new, empty bytearray in its place.
            chunks = Chunks()
            if cycle.body:
                chunks += bytes(cycle.body)
            cycle.body = chunks  # type: ignore[assignment]
        super().on_body(body)
