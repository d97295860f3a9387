"""Calling the OpenAI API (through the agent or vLLM directly) and reading answers."""

from __future__ import annotations

import json
from typing import Any

import httpx

from devharness.tcp_pause import HELD_PROMPT

HEADER = "X-Loraplane-Adapter"
COMPLETION: dict[str, Any] = {"prompt": "The registry publishes", "max_tokens": 16,
                              "temperature": 0, "ignore_eos": True, "return_token_ids": True}
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "Which version is this?"}],
                        "max_tokens": 16, "temperature": 0, "ignore_eos": True}
# A stream that stays in flight while a test takes its next steps: the agent reaches
# vLLM through a PausableTcpProxy, which holds the rest of this answer after its first
# event until the test releases it. Length alone proves nothing: on a loaded machine the
# whole answer can reach the agent before the test has read its first chunk.
HELD_STREAM: dict[str, Any] = {**COMPLETION, "prompt": HELD_PROMPT, "max_tokens": 400,
                               "stream": True}


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> httpx.Response:
    return await client.post(path, json=body, headers=headers)


def tokens(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    ids: list[int] = response.json()["choices"][0]["token_ids"]
    assert len(ids) == 16
    return ids


def sse(text: str) -> list[Any]:
    """The data of every SSE event; ``[DONE]`` stays a string."""
    events: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def streamed_text(events: list[Any], chat: bool) -> str:
    parts = []
    for event in events[:-1]:
        choice = event["choices"][0]
        parts.append((choice["delta"].get("content") or "") if chat else choice["text"])
    return "".join(parts)


def assert_openai_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]
    return error
