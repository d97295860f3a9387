"""What the vLLM stand-in (``devharness/vllm_standin.py``) answers to a generation, and
the faults it can be told to inject.

The answers have the shape of vLLM's OpenAI server (``/v1/completions`` and
``/v1/chat/completions``, plain or streamed as server-sent events ending in
``data: [DONE]``); the text is made of the model's name, so a client can tell which
version answered without the agent's ``X-Loraplane-Adapter`` header. No model runs.

A ``Fault`` is set per model name for the whole stand-in (every port):
``error_every`` N answers exactly every Nth generation of that model 500 (N = 20 is a
deterministic 5 %), ``delay_s`` replaces the default delay before an answer, and
``load_status`` answers every load of that name with that status (a version that
fails to load).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

# The fields a ``POST /_standin/faults`` body may carry, besides ``model``.
FAULT_FIELDS = ("error_every", "delay_s", "load_status")


@dataclass
class Fault:
    """What one model does wrong; ``seen`` counts its generations since it was set."""

    error_every: int = 0
    delay_s: float | None = None
    load_status: int | None = None
    seen: int = 0

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Fault:
        """A fault from a request body; ``ValueError`` for a field out of range."""
        unknown = set(body) - {"model", *FAULT_FIELDS}
        if unknown:
            raise ValueError(f"unknown fields: {sorted(unknown)}")
        error_every = int(body.get("error_every") or 0)
        delay = body.get("delay_s")
        load_status = body.get("load_status")
        if error_every < 0:
            raise ValueError("error_every must be 0 (off) or more")
        if delay is not None and not 0 <= float(delay) <= 600:
            raise ValueError("delay_s must be in [0, 600]")
        if load_status is not None and not 400 <= int(load_status) <= 599:
            raise ValueError("load_status must be an HTTP error status")
        return cls(error_every, None if delay is None else float(delay),
                   None if load_status is None else int(load_status))

    def fails_next(self) -> bool:
        """Count one generation; whether it is the one in ``error_every`` that fails."""
        self.seen += 1
        return self.error_every > 0 and self.seen % self.error_every == 0

    def shown(self) -> dict[str, Any]:
        return {"error_every": self.error_every, "delay_s": self.delay_s,
                "load_status": self.load_status, "seen": self.seen}


def error_body(status: int, message: str, kind: str = "BadRequestError") -> dict[str, Any]:
    """vLLM's error body."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def words(model: str, count: int) -> list[str]:
    """The generated "tokens": the model's name and a counter, ``count`` of them."""
    return [f" {model}:{i}" for i in range(max(count, 1))]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": None}


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    if chat:
        messages = body.get("messages") or []
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    else:
        text = str(body.get("prompt", ""))
    return max(len(text.split()), 1)


def max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_tokens") or body.get("max_completion_tokens") or 16
    return max(1, min(int(value), 4096))


def answer(model: str, body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """The whole (non-streamed) answer of a completion or a chat completion."""
    tokens = words(model, max_tokens(body))
    text = "".join(tokens)
    common = {"id": _id(chat), "created": int(time.time()), "model": model,
              "usage": _usage(_prompt_tokens(body, chat), len(tokens))}
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text,
                                                          "tool_calls": []},
                                  "logprobs": None, "finish_reason": "length",
                                  "stop_reason": None}
        return {**common, "object": "chat.completion", "choices": [choice]}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
              "stop_reason": None, "prompt_logprobs": None}
    return {**common, "object": "text_completion", "choices": [choice]}


async def stream(model: str, body: dict[str, Any], *, chat: bool) -> AsyncIterator[bytes]:
    """The answer as vLLM streams it: one event per token, the last with its
    ``finish_reason``, a usage event if ``stream_options.include_usage``, then
    ``[DONE]``."""
    ident, created = _id(chat), int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    tokens = words(model, max_tokens(body))

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        data = {"id": ident, "object": kind, "created": created, "model": model,
                "choices": choices, **extra}
        return f"data: {json.dumps(data)}\n\n".encode()

    if chat:
        yield event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                      "logprobs": None, "finish_reason": None}])
    for i, token in enumerate(tokens):
        finish = "length" if i == len(tokens) - 1 else None
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": token},
                                      "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": token, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}
        yield event([choice])
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        yield event([], usage=_usage(_prompt_tokens(body, chat), len(tokens)))
    yield b"data: [DONE]\n\n"


def _id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(16)}"
