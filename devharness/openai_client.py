"""A small OpenAI-API client for the agent (or vLLM directly).

Every answer records the ``X-Loraplane-Adapter`` header (which version served it) and
the generated text. Greedy settings are the default, so the same version always gives
the same text and two versions give different ones.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

ADAPTER_HEADER = "X-Loraplane-Adapter"
PROMPT = "The registry publishes"
GREEDY: dict[str, Any] = {"temperature": 0, "ignore_eos": True, "seed": 0}

# What a check of ``devharness.waiting.eventually`` that asks a server may raise while
# the answer it waits for is not there yet: pass it as ``retrying``.
RETRY_OVER_HTTP: tuple[type[Exception], ...] = (
    AssertionError, httpx.HTTPError, KeyError, ValueError)

# Under uvicorn's 5 s keep-alive, which vLLM keeps: with httpx's default of 5 s too, a
# connection idle that long is reused just as the server closes it, and the request on
# it fails (a ReadError).
KEEPALIVE_EXPIRY_S = 3.0


def limits(max_connections: int | None = 100) -> httpx.Limits:
    """httpx's limits with that expiry: for every client that talks to vLLM or uvicorn."""
    return httpx.Limits(max_connections=max_connections, keepalive_expiry=KEEPALIVE_EXPIRY_S)


@dataclass
class Completion:
    """One answer: status, the version that served it, the text (or the error)."""

    status: int
    adapter: str | None
    text: str = ""
    model: str | None = None
    error: dict[str, Any] | None = None
    finish_reason: str | None = None
    chunks: int = 0
    started: float = field(default_factory=time.monotonic)
    # When the status and headers arrived: for a stream, the moment the version that
    # serves it (ADAPTER_HEADER) was known, before any text.
    answered_at: float = field(default_factory=time.monotonic)
    last_chunk_at: float | None = None
    ended: float | None = None
    models_seen: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def __str__(self) -> str:
        shown = self.error if self.error is not None else repr(self.text[:80])
        return f"<{self.status} {self.adapter} {shown}>"


def _error_of(response: httpx.Response, raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        return {"message": raw.decode(errors="replace"), "code": None}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {"message": str(body), "code": None}


class OpenAIClient:
    """``/v1/completions`` (plain and streamed), ``/v1/chat/completions``, ``/v1/models``."""

    def __init__(self, base_url: str, *, token: str | None = None,
                 timeout_s: float = 300.0) -> None:
        """``token``: the inference token an agent asks for (vLLM itself needs none)."""
        self.base_url = base_url
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s, headers=headers,
                                      limits=limits())

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def complete(self, model: str | None, *, prompt: str = PROMPT, max_tokens: int = 16,
                       headers: Mapping[str, str] | None = None, **extra: Any) -> Completion:
        body = self._body(model, {"prompt": prompt, "max_tokens": max_tokens}, extra)
        return await self._answer("/v1/completions", body, headers,
                                  lambda choice: str(choice["text"]))

    async def chat(self, model: str | None, content: str, *, max_tokens: int = 16,
                   headers: Mapping[str, str] | None = None, **extra: Any) -> Completion:
        messages = [{"role": "user", "content": content}]
        body = self._body(model, {"messages": messages, "max_tokens": max_tokens}, extra)
        return await self._answer("/v1/chat/completions", body, headers,
                                  lambda choice: choice["message"]["content"] or "")

    async def _answer(self, path: str, body: dict[str, Any],
                      headers: Mapping[str, str] | None,
                      text_of: Callable[[dict[str, Any]], str]) -> Completion:
        """One non-streamed request; ``text_of`` finds the text in a choice."""
        response = await self.http.post(path, json=body, headers=headers)
        result = Completion(status=response.status_code,
                            adapter=response.headers.get(ADAPTER_HEADER))
        result.ended = time.monotonic()
        if response.status_code != 200:
            result.error = _error_of(response, response.content)
            return result
        data = response.json()
        choice = data["choices"][0]
        result.text, result.model = text_of(choice), data.get("model")
        result.finish_reason = choice.get("finish_reason")
        return result

    async def stream(self, model: str | None, *, prompt: str = PROMPT, max_tokens: int = 200,
                     headers: Mapping[str, str] | None = None,
                     first_chunk: asyncio.Event | None = None, **extra: Any) -> Completion:
        """A streamed completion read to its end; ``first_chunk`` is set when the first
        text arrives (the request then holds its lease on the version)."""
        body = self._body(model, {"prompt": prompt, "max_tokens": max_tokens,
                                  "stream": True}, extra)
        async with self.http.stream("POST", "/v1/completions", json=body,
                                    headers=headers) as response:
            result = Completion(status=response.status_code,
                                adapter=response.headers.get(ADAPTER_HEADER))
            if response.status_code != 200:
                result.error = _error_of(response, await response.aread())
                result.ended = time.monotonic()
                return result
            async for line in response.aiter_lines():
                self._stream_line(line, result, first_chunk)
        result.ended = time.monotonic()
        return result

    @staticmethod
    def _stream_line(line: str, result: Completion, first_chunk: asyncio.Event | None) -> None:
        if not line.startswith("data: "):
            return
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            result.finish_reason = result.finish_reason or "done"
            return
        event = json.loads(data)
        if "error" in event:
            result.error = event["error"]
            return
        if not event.get("choices"):
            # The usage-only event that `stream_options.include_usage` adds at the end.
            return
        choice = event["choices"][0]
        result.text += choice.get("text") or ""
        result.model = event.get("model", result.model)
        if result.model is not None:
            result.models_seen.add(result.model)
        result.finish_reason = choice.get("finish_reason") or result.finish_reason
        result.chunks += 1
        result.last_chunk_at = time.monotonic()
        if first_chunk is not None:
            first_chunk.set()

    async def models(self) -> list[str]:
        response = await self.http.get("/v1/models")
        response.raise_for_status()
        return [entry["id"] for entry in response.json()["data"]]

    @staticmethod
    def _body(model: str | None, body: dict[str, Any], extra: Mapping[str, Any]
              ) -> dict[str, Any]:
        full = {**GREEDY, **body, **extra}
        if model is not None:
            full["model"] = model
        return full

