"""One aiohttp session per peer, made on first use.

aiohttp binds a session to the event loop it is made in, and the agent's clients are
built before its loop runs; so each client holds a ``LazySession`` and asks it for the
session when it first sends something.
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp


class LazySession:
    """Keep-alive connections to one kind of peer, with cookies off (no peer sets any the
    agent should send back) and idle connections dropped after ``keepalive_s``."""

    def __init__(self, *, timeout: aiohttp.ClientTimeout, keepalive_s: float,
                 limit: int = 100, auto_decompress: bool = True,
                 trace_configs: Sequence[aiohttp.TraceConfig] = ()) -> None:
        self._timeout = timeout
        self._keepalive_s = keepalive_s
        self._limit = limit
        self._auto_decompress = auto_decompress
        self._trace_configs = trace_configs
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        """The session, made now if this is the first call."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=0,
                                             keepalive_timeout=self._keepalive_s)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout,
                auto_decompress=self._auto_decompress,
                cookie_jar=aiohttp.DummyCookieJar(),
                trace_configs=list(self._trace_configs) or None)
        return self._session

    async def aclose(self) -> None:
        """Close the connections; a later ``get`` makes a new session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
