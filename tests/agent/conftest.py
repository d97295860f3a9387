"""Fixtures shared by the agent tests that run a real vLLM."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.relay import PausableRelay
from tests.support.vllm import VllmServer


@pytest.fixture(scope="module")
def relay(vllm_server: VllmServer) -> Iterator[PausableRelay]:
    """The agents' way to the module's vLLM (its ``vllm_server`` fixture): passes
    everything, and holds a stream with HELD_PROMPT while the test says so."""
    with PausableRelay(vllm_server.url) as relay:
        yield relay
