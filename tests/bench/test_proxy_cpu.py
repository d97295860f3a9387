"""The short version of ``bench/proxy_cpu.py``: it still runs, for this checkout's proxy
and another commit's, and gives a CPU figure for each; how large is the bench's to say."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

from bench.proxy_cpu import REQUEST, main, round_ratios, serve_upstream
from devharness.waiting import eventually
from loraplane.netutil import free_port


def test_the_proxy_cpu_benchmark_measures_every_proxy_and_the_relay(tmp_path: Path
                                                                     ) -> None:
    out = tmp_path / "result.json"
    # 300 requests: about 60 ms of the proxy's CPU, several 10 ms ticks, so a round
    # reads more than nothing on a loaded machine too.
    result = main(["--requests", "300", "--rounds", "2", "--also-commit", "HEAD",
                   "--bare", "--granian", "--relay", "--json-out", str(out)])
    assert json.loads(out.read_text()) == result
    names = list(result["cpu_ms_per_request"])
    assert names[0] == "proxy" and names[1].startswith("proxy@")
    others = ["proxy, bare front door", "proxy, granian asgi", "proxy, granian rsgi"]
    assert names[2:] == [*others, "relay"]
    assert list(result["wall_ms_per_request"]) == names
    for name in names[:5]:  # the relay's CPU may stay under one 10 ms tick
        assert all(v > 0 for v in result["cpu_ms_per_request"][name])
    for name in others:
        ratio, half_width = result[f"ratio_to_{name}"]
        assert ratio > 0 and half_width >= 0
    for kind in ("cpu_ms_per_request", "wall_ms_per_request"):
        assert all(len(v) == 2 and min(v) >= 0 for v in result[kind].values())
    assert all(w > 0 for v in result["wall_ms_per_request"].values() for w in v)
    ratio, half_width = result[f"ratio_to_{names[1]}"]
    assert ratio > 0 and half_width >= 0 and result["rounds_without_ratio"] == 0
    assert len(result["commit"]["commit"]) == 40


def test_a_round_that_reads_no_cpu_gives_no_ratio() -> None:
    # CI once divided by a round of 50 requests that read 0 ticks of the proxy's CPU.
    assert round_ratios([0.0, 0.2, 0.1], [0.3, 0.4, 0.0]) == [2.0, 0.0]
    assert round_ratios([0.0], [0.3]) == []


def test_the_stand_in_can_answer_after_a_delay_as_vllm_does(tmp_path: Path) -> None:
    result = main(["--requests", "100", "--rounds", "1", "--upstream-delay-ms", "5",
                   "--json-out", str(tmp_path / "result.json")])
    assert result["upstream_delay_ms"] == 5.0
    assert list(result["cpu_ms_per_request"]) == ["proxy"]
    assert "ratio_to_proxy" not in result


async def test_a_delayed_answer_comes_no_sooner_than_its_delay() -> None:
    port = free_port()
    server = asyncio.create_task(serve_upstream(port, 0.2))
    try:
        reader, writer = await eventually(
            lambda: asyncio.open_connection("127.0.0.1", port), timeout_s=60,
            what="the stand-in listening", retrying=(ConnectionRefusedError,))
        sent = time.monotonic()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d"
                     b"\r\n\r\n%s" % (len(REQUEST), REQUEST))
        head = await reader.readuntil(b"\r\n\r\n")
        # A lower bound only: a loaded machine can make it later, never sooner.
        assert time.monotonic() - sent >= 0.2 and head.startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server
