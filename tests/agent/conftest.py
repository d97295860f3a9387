"""Fixtures shared by the agent tests that run a real vLLM (the server itself is the
run's shared one: ``vllm_server`` in tests/vllm_fixtures.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devharness.tcp_pause import PausableTcpProxy
from devharness.vllm import VllmServer


@pytest.fixture(scope="module")
def tcp_proxy(vllm_server: VllmServer) -> Iterator[PausableTcpProxy]:
    """The agents' way to the module's vLLM (its ``vllm_server`` fixture): passes
    everything, and holds a stream with HELD_PROMPT while the test says so."""
    with PausableTcpProxy(vllm_server.url) as tcp_proxy:
        yield tcp_proxy
