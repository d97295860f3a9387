"""Webhook gates on both backends, against a real HTTP server: a ``pre`` gate holds the
canary at weight 0 until it passes; a ``step`` gate's failure rolls the canary back
with the gate's answer as the reason; a gate that never answers fails at its timeout;
every call is signed (HMAC over the timestamp and the body); and a gate naming a host
the registry may not call is refused at the start."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from devharness.registry import RegistryHarness
from registry_service.canaries.webhooks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signature,
    webhook_secret,
)
from tests.agent.proxy_harness import serve_asgi
from tests.registry.canaries import support as c


@dataclass
class Gate:
    """A webhook receiver: answers ``answers`` in turn (the last one from then on)."""

    url: str = ""
    answers: list[tuple[int, str]] = field(default_factory=lambda: [(200, "")])
    calls: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    hang: asyncio.Event | None = None

    async def receive(self, request: Request) -> Response:
        self.calls.append((dict(request.headers), await request.body()))
        if self.hang is not None:
            await self.hang.wait()
        status, text = self.answers[min(len(self.calls), len(self.answers)) - 1]
        return PlainTextResponse(text, status_code=status)


@pytest.fixture
async def gate(registry: RegistryHarness) -> AsyncIterator[Gate]:
    found = Gate()
    app = Starlette(routes=[Route("/gate", found.receive, methods=["POST"])])
    registry.ctx.settings.canary_webhook_hosts = ["127.0.0.1"]
    async with serve_asgi(app) as url:
        found.url = f"{url}/gate"
        yield found
        if found.hang is not None:
            found.hang.set()


def hooks(gate: Gate, phase: str = "step", timeout_s: float = 10) -> dict[str, Any]:
    return {**c.ANALYSIS, "webhooks": [{"name": "eval", "url": gate.url, "phase": phase,
                                       "timeout_s": timeout_s}]}


def signed_by(registry: RegistryHarness, headers: dict[str, str], body: bytes) -> bool:
    key = webhook_secret(registry.settings)
    stamp = headers[TIMESTAMP_HEADER.lower()]
    expected = "sha256=" + hmac.new(key, stamp.encode() + b"." + body,
                                    hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers[SIGNATURE_HEADER.lower()], expected)


async def test_a_pre_gate_holds_the_canary_at_weight_0_until_it_passes(
    registry: RegistryHarness, tmp_path: Path, gate: Gate,
) -> None:
    gate.answers = [(503, "the eval harness is warming up"), (200, "ok")]
    analysis = {**hooks(gate, "pre"), "failure_limit": 1}
    cid = await c.running(registry, tmp_path, analysis=analysis)
    stepped = await c.canary_when(registry, step=1)
    assert stepped["weight"] == 10 and stepped["state"] == "progressing"
    assert stepped["reason"] == "the gates before the first step passed; now 10%"
    assert [check["verdict"] for check in stepped["checks"]] == ["pass"]
    assert len(gate.calls) == 2
    for headers, body in gate.calls:
        assert signed_by(registry, headers, body)
        sent = json.loads(body)
        assert (sent["phase"], sent["canary"]["id"], sent["canary"]["step"]) == ("pre", cid, 0)
    weights = [(e["action"], e["canary"] and e["canary"]["weight"])
               for e in await c.alias_events(registry)]
    assert weights[-2:] == [("canary_start", 0), ("canary_step", 10)]


async def test_a_failing_step_gate_rolls_the_canary_back(
    registry: RegistryHarness, tmp_path: Path, gate: Gate,
) -> None:
    gate.answers = [(500, "golden prompts: 3 of 20 wrong")]
    aborted = await c.first_step(registry, tmp_path, {"requests": 100}, {"requests": 40},
                                 "aborted", analysis=hooks(gate))
    assert aborted["reason"] == ("rolled back by the analysis at step 1 of 2 (10%): "
                                 "webhook eval answered 500: golden prompts: 3 of 20 wrong")
    verdicts = {check["metric"]: check["verdict"] for check in aborted["checks"]}
    assert verdicts["webhook:eval"] == "fail" and verdicts["requests"] == "pass"
    (headers, body), = gate.calls
    assert signed_by(registry, headers, body) and json.loads(body)["phase"] == "step"
    assert await c.alias_version(registry) == 1


async def test_a_gate_that_never_answers_fails_at_its_timeout(
    registry: RegistryHarness, tmp_path: Path, gate: Gate,
) -> None:
    gate.hang = asyncio.Event()
    aborted = await c.first_step(registry, tmp_path, {"requests": 100}, {"requests": 40},
                                 "aborted", analysis=hooks(gate, timeout_s=0.2))
    assert aborted["reason"].endswith("webhook eval did not answer within 0.2 s")


async def test_gates_the_registry_may_not_call_are_refused(
    registry: RegistryHarness, tmp_path: Path, gate: Gate,
) -> None:
    await c.bot(registry, tmp_path)
    elsewhere = {"webhooks": [{"name": "eval", "url": "http://169.254.169.254/latest"}]}
    status, body = await c.start_canary(registry, analysis=elsewhere)
    assert status == 422 and body["error"]["code"] == "webhook_host_not_allowed"
    assert body["error"]["detail"] == {"webhook": "eval", "host": "169.254.169.254"}
    for bad in ([{"name": "eval", "url": gate.url}, {"name": "eval", "url": gate.url}],
                [{"name": "eval", "url": "file:///etc/passwd"}],
                [{"name": "Eval!", "url": gate.url}],
                [{"name": "eval", "url": gate.url, "timeout_s": 600}]):
        status, body = await c.start_canary(registry, analysis={"webhooks": bad})
        assert status == 422 and body["error"]["code"] == "invalid_request", bad
    assert gate.calls == []


def test_the_signature_is_hmac_sha256_of_the_timestamp_and_the_body() -> None:
    expected = hmac.new(b"key", b"1700000000.{}", hashlib.sha256).hexdigest()
    assert signature(b"key", "1700000000", b"{}") == f"sha256={expected}"
