"""What the real vLLM server (CPU build) does with LoRA adapters, on the tiny model.

These pin the upstream behaviour the inference agent relies on. Requests are sent one
at a time: on the CPU path, base-model requests batched with adapter requests can come
out wrong (docs/vllm.md, "A known engine bug on the CPU path"), and these tests compare
outputs exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from devharness.vllm import (
    DEFAULT_BASE_MODEL_NAME,
    VllmServer,
)

pytestmark = pytest.mark.vllm

BASE = DEFAULT_BASE_MODEL_NAME
PROMPT = "The registry publishes"


@pytest.fixture(scope="module")
def server(vllm_server: VllmServer) -> VllmServer:
    return vllm_server


@pytest.fixture(scope="module")
def client(server: VllmServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0) as http:
        yield http


def load(client: httpx.Client, name: str, path: Path) -> httpx.Response:
    return client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})


def unload(client: httpx.Client, name: str) -> httpx.Response:
    return client.post("/v1/unload_lora_adapter", json={"lora_name": name})


@contextmanager
def loaded(client: httpx.Client, tiny_model: Path, adapter: str, name: str) -> Iterator[str]:
    """Load adapter under name for the block, and unload it afterwards."""
    response = load(client, name, tiny_model / "adapters" / adapter)
    assert response.status_code == 200, response.text
    try:
        yield name
    finally:
        unload(client, name)


def models(client: httpx.Client) -> dict[str, str | None]:
    response = client.get("/v1/models")
    assert response.status_code == 200, response.text
    return {entry["id"]: entry.get("parent") for entry in response.json()["data"]}


def greedy(client: httpx.Client, model: str) -> list[int]:
    """Token ids of a 16-token greedy completion; ignore_eos keeps the length fixed."""
    response = client.post(
        "/v1/completions",
        json={
            "model": model,
            "prompt": PROMPT,
            "max_tokens": 16,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert response.status_code == 200, response.text
    choice: dict[str, Any] = response.json()["choices"][0]
    token_ids: list[int] = choice["token_ids"]
    assert len(token_ids) == 16
    return token_ids


def error_message(response: httpx.Response) -> str:
    body: dict[str, Any] = response.json()
    message: str = body["error"]["message"]
    return message


def test_base_model_is_served(client: httpx.Client) -> None:
    assert models(client) == {BASE: None}


def test_loaded_adapter_is_listed_under_the_base(client: httpx.Client, tiny_model: Path) -> None:
    config = json.loads((tiny_model / "adapters" / "a1" / "adapter_config.json").read_text())
    # The config names the base by its served name, not a path, and vLLM takes it.
    assert config["base_model_name_or_path"] == BASE
    response = load(client, "listed-a1", tiny_model / "adapters" / "a1")
    try:
        assert response.status_code == 200, response.text
        assert "added successfully" in response.text
        assert models(client)["listed-a1"] == BASE
    finally:
        unload(client, "listed-a1")


def test_adapter_greedy_output_is_deterministic_and_not_the_base(
    client: httpx.Client, tiny_model: Path
) -> None:
    base = greedy(client, BASE)
    with loaded(client, tiny_model, "a1", "det-a1") as name:
        first = greedy(client, name)
        assert greedy(client, name) == first
        assert first != base
    assert greedy(client, BASE) == base


def test_valid_adapters_give_distinct_outputs_beyond_max_loras(
    client: httpx.Client, tiny_model: Path
) -> None:
    names = [f"a{i}" for i in range(1, 6)]  # five adapters, four GPU-side slots
    outputs: dict[str, list[int]] = {}
    try:
        for adapter in names:
            assert load(client, f"many-{adapter}", tiny_model / "adapters" / adapter).is_success
            outputs[adapter] = greedy(client, f"many-{adapter}")
        assert len({tuple(ids) for ids in outputs.values()}) == len(names)
        # After slot churn, every adapter still gives its own output.
        for adapter in names:
            assert greedy(client, f"many-{adapter}") == outputs[adapter]
    finally:
        for adapter in names:
            unload(client, f"many-{adapter}")


def test_zero_adapter_gives_the_base_output(client: httpx.Client, tiny_model: Path) -> None:
    base = greedy(client, BASE)
    with loaded(client, tiny_model, "zero", "zero") as name:
        assert greedy(client, name) == base


def test_unload_removes_the_adapter(client: httpx.Client, tiny_model: Path) -> None:
    assert load(client, "gone", tiny_model / "adapters" / "a2").status_code == 200
    assert "gone" in models(client)
    response = unload(client, "gone")
    assert response.status_code == 200, response.text
    assert "gone" not in models(client)
    request = {"model": "gone", "prompt": PROMPT, "max_tokens": 4}
    assert client.post("/v1/completions", json=request).status_code == 404
    again = unload(client, "gone")
    assert again.status_code == 404
    assert "cannot be found" in error_message(again)


def test_a_loaded_name_cannot_be_loaded_again(client: httpx.Client, tiny_model: Path) -> None:
    """Why every version gets its own name: reusing one needs load_inplace."""
    with loaded(client, tiny_model, "a3", "twice") as name:
        response = load(client, name, tiny_model / "adapters" / "a4")
        assert response.status_code == 400
        assert "load_inplace" in error_message(response)


@pytest.mark.parametrize(
    ("adapter", "reason"),
    [("bad-rank", "greater than max_lora_rank"), ("other-base-wide", "must match the size")],
)
def test_refused_adapters_leave_the_server_serving(
    client: httpx.Client, server: VllmServer, tiny_model: Path, adapter: str, reason: str
) -> None:
    base = greedy(client, BASE)
    response = load(client, f"refused-{adapter}", tiny_model / "adapters" / adapter)
    assert response.status_code == 500, response.text
    assert reason in error_message(response)
    assert f"refused-{adapter}" not in models(client)
    assert server.is_running()
    assert greedy(client, BASE) == base


def test_vllm_silently_accepts_an_adapter_for_a_narrower_base(
    client: httpx.Client, tiny_model: Path
) -> None:
    """vLLM pads smaller LoRA weights into its slots, so the agent must check shapes."""
    with loaded(client, tiny_model, "other-base", "narrow") as name:
        assert models(client)[name] == BASE
        assert greedy(client, name) != greedy(client, BASE)


def test_missing_adapter_path_is_404(client: httpx.Client, tiny_model: Path) -> None:
    response = load(client, "nowhere", tiny_model / "adapters" / "does-not-exist")
    assert response.status_code == 404
    assert "nowhere" not in models(client)


def stream_chat(client: httpx.Client, request: dict[str, Any]) -> tuple[list[str], set[str]]:
    """Content deltas and model names of a streamed chat completion."""
    deltas: list[str] = []
    model_names: set[str] = set()
    with client.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    for event in events[:-1]:
        chunk: dict[str, Any] = json.loads(event)
        model_names.add(chunk["model"])
        deltas.extend(c["delta"].get("content") or "" for c in chunk["choices"])
    return deltas, model_names


def test_chat_completion_streams_the_same_text(client: httpx.Client, tiny_model: Path) -> None:
    with loaded(client, tiny_model, "a2", "chat-a2") as name:
        request: dict[str, Any] = {
            "model": name,
            "messages": [{"role": "user", "content": "Which version served this?"}],
            "max_tokens": 16,
            "temperature": 0,
            "ignore_eos": True,
        }
        whole = client.post("/v1/chat/completions", json=request)
        assert whole.status_code == 200, whole.text
        text: str = whole.json()["choices"][0]["message"]["content"]
        deltas, model_names = stream_chat(client, {**request, "stream": True})
        assert model_names == {name}
        assert len([d for d in deltas if d]) > 1
        assert "".join(deltas) == text
