"""The vLLM stand-in's generations and faults (devharness/vllm_standin.py), through its
ASGI app: two base URLs with two ports are two of its ports, each with its own loaded
names; faults hold on every port."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from devharness.vllm_standin import StandIn, create_app

PORT_A, PORT_B = "http://standin:8001", "http://standin:8002"


@pytest.fixture
async def standin() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(StandIn("tiny", delay_s=0.0)))
    async with httpx.AsyncClient(transport=transport, base_url=PORT_A) as client:
        yield client


async def load(client: httpx.AsyncClient, name: str, path: Path,
               base: str = PORT_A) -> httpx.Response:
    return await client.post(f"{base}/v1/load_lora_adapter",
                             json={"lora_name": name, "lora_path": str(path)})


async def test_completions_answer_for_the_base_and_loaded_names_only(
        standin: httpx.AsyncClient, tmp_path: Path) -> None:
    assert (await load(standin, "bot@1", tmp_path)).status_code == 200
    for model in ("tiny", "bot@1"):
        response = await standin.post("/v1/completions",
                                      json={"model": model, "prompt": "hi", "max_tokens": 3})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "text_completion" and body["model"] == model
        assert body["choices"][0]["text"] == f" {model}:0 {model}:1 {model}:2"
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 3
    chat = await standin.post("/v1/chat/completions", json={
        "model": "bot@1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert chat.status_code == 200
    assert chat.json()["object"] == "chat.completion"
    assert chat.json()["choices"][0]["message"] == {
        "role": "assistant", "content": " bot@1:0 bot@1:1", "tool_calls": []}
    # Loaded on one port only: the other does not know it, as another vLLM would not.
    unknown = await standin.post(f"{PORT_B}/v1/completions", json={"model": "bot@1"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "The model `bot@1` does not exist."
    assert unknown.json()["error"]["type"] == "NotFoundError"


async def test_a_stream_is_server_sent_events_ending_in_done(
        standin: httpx.AsyncClient) -> None:
    for path, chat in (("/v1/completions", False), ("/v1/chat/completions", True)):
        body = {"model": "tiny", "max_tokens": 3, "stream": True,
                "stream_options": {"include_usage": True},
                **({"messages": [{"role": "user", "content": "x"}]} if chat
                   else {"prompt": "x"})}
        async with standin.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in response.aiter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        assert events[-1]["usage"]["completion_tokens"] == 3 and events[-1]["choices"] == []
        choices = [e["choices"][0] for e in events[:-1]]
        if chat:
            assert choices[0]["delta"] == {"role": "assistant", "content": ""}
            text = "".join(c["delta"].get("content", "") for c in choices)
        else:
            text = "".join(c["text"] for c in choices)
        assert text == " tiny:0 tiny:1 tiny:2"
        assert [c["finish_reason"] for c in choices][-1] == "length"


async def test_exactly_every_nth_request_fails_on_every_port(standin: httpx.AsyncClient,
                                                             tmp_path: Path) -> None:
    for base in (PORT_A, PORT_B):
        assert (await load(standin, "bot@2", tmp_path, base)).status_code == 200
    set_ = await standin.post("/_standin/faults", json={"model": "bot@2", "error_every": 5})
    assert set_.status_code == 200
    statuses = [(await standin.post(f"{base}/v1/completions",
                                    json={"model": "bot@2", "prompt": "x"})).status_code
                for _ in range(10) for base in (PORT_A, PORT_B)]
    assert [i + 1 for i, s in enumerate(statuses) if s != 200] == [5, 10, 15, 20]
    assert set(statuses) == {200, 500}
    streamed = await standin.post("/v1/completions", json={"model": "bot@2", "stream": True})
    assert streamed.status_code == 200  # the 21st
    # Other models are untouched.
    assert await statuses_of(standin, "tiny", 10) == {200}
    shown = (await standin.get(f"{PORT_B}/_standin/faults")).json()["faults"]
    assert shown == {"bot@2": {"error_every": 5, "delay_s": None, "load_status": None,
                               "seen": 21}}
    assert (await standin.delete("/_standin/faults")).json() == {"faults": {}}
    assert await statuses_of(standin, "bot@2", 10) == {200}


async def statuses_of(client: httpx.AsyncClient, model: str, count: int) -> set[int]:
    return {(await client.post("/v1/completions", json={"model": model})).status_code
            for _ in range(count)}


async def test_the_delay_is_the_default_or_the_models_own(tmp_path: Path) -> None:
    transport = httpx.ASGITransport(app=create_app(StandIn("tiny", delay_s=0.05)))
    async with httpx.AsyncClient(transport=transport, base_url=PORT_A) as client:
        await client.post("/_standin/faults", json={"model": "tiny", "delay_s": 0.3})
        started = time.monotonic()
        assert (await client.post("/v1/completions", json={"model": "tiny"})).status_code == 200
        assert time.monotonic() - started >= 0.3
        await client.delete("/_standin/faults", params={"model": "tiny"})
        started = time.monotonic()
        assert (await client.post("/v1/completions", json={"model": "tiny"})).status_code == 200
        assert time.monotonic() - started >= 0.05  # an upper bound would bet on the machine


async def test_a_load_fault_refuses_that_name_everywhere(standin: httpx.AsyncClient,
                                                         tmp_path: Path) -> None:
    await standin.post("/_standin/faults", json={"model": "bot@3", "load_status": 500})
    for base in (PORT_A, PORT_B):
        refused = await load(standin, "bot@3", tmp_path, base)
        assert refused.status_code == 500
        assert "bot@3" in refused.json()["error"]["message"]
    assert (await load(standin, "bot@4", tmp_path)).status_code == 200
    calls = (await standin.get("/_standin/calls")).json()
    assert [c["name"] for c in calls["calls"]] == ["bot@4"]  # a refused load is no call
    await standin.delete("/_standin/faults")
    assert (await load(standin, "bot@3", tmp_path)).status_code == 200


@pytest.mark.parametrize("body", [{"error_every": 2}, {"model": "x", "error_every": -1},
                                  {"model": "x", "load_status": 200},
                                  {"model": "x", "delay_s": -1}, {"model": "x", "oops": 1}])
async def test_a_bad_fault_is_refused(standin: httpx.AsyncClient,
                                      body: dict[str, object]) -> None:
    response = await standin.post("/_standin/faults", json=body)
    assert response.status_code == 400, response.text
    assert (await standin.get("/_standin/faults")).json() == {"faults": {}}
