"""One real vLLM server (CPU build, the tiny model) for every test module that needs
a plain one, started at the first such module and stopped at the end of the run.

Starting vLLM costs 30 to 100 s on these machines, most of a minute of CI per module
that started its own. What a module could leak to the next is the adapters it left
loaded; ``vllm_server`` unloads them all before handing the server to a module, so
each module starts from the base model alone, as it did with a server of its own.
Names are never reused with other weights across modules (vLLM refuses a second load
of a loaded name, and nothing is loaded when a module starts).

Its context is ``SHARED_CONTEXT`` tokens, room for the long streams the proxy tests
hold in flight; Llama's positions are rotary, so short prompts give the same output
as on a 256-token server (``devharness.testbed.long_context_base``).

The end-to-end testbed (``tests/e2e``) and the container tests run servers of their
own: their agents count loads in vLLM's log and own their LoRA slots.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devharness.testbed import long_context_base
from devharness.vllm import (
    VllmEnvError,
    VllmServer,
    VllmServerError,
    ensure_tiny_model,
    ensure_vllm_env,
)

SHARED_CONTEXT = 4096
SHARED_MAX_LORAS = 4


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    try:
        return ensure_vllm_env(install=True)
    except VllmEnvError as exc:
        pytest.fail(f"the vLLM venv could not be made:\n{exc}", pytrace=False)


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama and its test adapters (``scripts/vllm/build_tiny_model.py``),
    built once per run: the build is seeded, so every build gives the same weights."""
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny-model"), vllm_python)


@pytest.fixture(scope="session")
def shared_vllm(vllm_python: Path, tiny_model: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    base = long_context_base(tiny_model, SHARED_CONTEXT)
    log_path = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    with VllmServer(vllm_python, base, log_path, max_loras=SHARED_MAX_LORAS,
                    extra_args=("--max-model-len", str(SHARED_CONTEXT))) as server:
        try:
            server.wait_ready(timeout=300)
        except VllmServerError as exc:
            pytest.fail(f"vLLM could not be started:\n{exc}", pytrace=False)
        yield server


@pytest.fixture(scope="module")
def vllm_server(shared_vllm: VllmServer) -> VllmServer:
    """The shared server with no adapter loaded, for one module."""
    if not shared_vllm.is_running():
        pytest.fail(f"the shared vLLM has exited:\n{shared_vllm.log_tail()}", pytrace=False)
    shared_vllm.unload_all()
    return shared_vllm
