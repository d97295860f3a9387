"""The agent's one way of making an aiohttp session (inference_agent/lazy_session.py)."""

from __future__ import annotations

import aiohttp

from inference_agent.lazy_session import LazySession


def lazy(**kwargs: object) -> LazySession:
    return LazySession(timeout=aiohttp.ClientTimeout(total=7), keepalive_s=2.0,
                       **kwargs)  # type: ignore[arg-type]


async def test_one_session_until_closed_then_a_new_one() -> None:
    holder = lazy(limit=9)
    first = holder.get()
    assert holder.get() is first
    assert first.timeout.total == 7
    connector = first.connector
    assert isinstance(connector, aiohttp.TCPConnector)
    assert connector.limit == 9 and connector.limit_per_host == 0
    assert isinstance(first.cookie_jar, aiohttp.DummyCookieJar)
    await holder.aclose()
    assert first.closed
    second = holder.get()
    assert second is not first and not second.closed
    await holder.aclose()
    await holder.aclose()  # closing twice is harmless


async def test_trace_configs_added_before_first_use_are_seen() -> None:
    traces: list[aiohttp.TraceConfig] = []
    holder = lazy(trace_configs=traces)
    trace = aiohttp.TraceConfig()
    traces.append(trace)
    session = holder.get()
    assert trace in session.trace_configs
    await holder.aclose()


async def test_decompression_can_be_left_to_the_client() -> None:
    holder = lazy(auto_decompress=False)
    assert holder.get().auto_decompress is False
    await holder.aclose()
