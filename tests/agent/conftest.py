"""Fixtures shared by the agent tests that run a real vLLM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devharness.tcp_pause import PausableTcpProxy
from devharness.vllm import VllmServer, ensure_tiny_model, ensure_vllm_env


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama and its adapters, for the module."""
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny-model"),
                             ensure_vllm_env(install=True))


@pytest.fixture(scope="module")
def vllm_server(tiny_model: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A CPU vLLM with the tiny model and 4 LoRA slots, for the module."""
    with VllmServer(ensure_vllm_env(), tiny_model / "base",
                    tmp_path_factory.mktemp("vllm-log") / "vllm.log", max_loras=4) as server:
        server.wait_ready(timeout=300)
        yield server


@pytest.fixture(scope="module")
def tcp_proxy(vllm_server: VllmServer) -> Iterator[PausableTcpProxy]:
    """The agents' way to the module's vLLM (its ``vllm_server`` fixture): passes
    everything, and holds a stream with HELD_PROMPT while the test says so."""
    with PausableTcpProxy(vllm_server.url) as tcp_proxy:
        yield tcp_proxy
