"""Steps the end-to-end tests share: reference outputs, waiting for a version, vLLM's list.

Output comparisons never run a base-model request beside adapter requests: the CPU
engine can get base requests wrong in a mixed batch (docs/vllm.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import update
from sqlalchemy.ext.asyncio import create_async_engine

from devharness.openai_client import RETRY_OVER_HTTP, Completion, OpenAIClient
from devharness.tcp_pause import HELD_PROMPT, PausableTcpProxy
from devharness.testbed import Testbed
from devharness.waiting import Unexpected, eventually
from loraplane.api import AgentOut
from loraplane.client import AsyncRegistryClient
from registry_service.canaries.models import CanaryRow
from registry_service.db.base import utcnow
from registry_service.settings import normalize_database_url

# Streams that must stay in flight go through a PausableTcpProxy (devharness/tcp_pause.py)
# between the agent and vLLM, which holds back the rest of any answer to a prompt with
# HOLD_MARKER (HELD_PROMPT) after its first event, until the test releases it. Their length is then
# no bet on the machine's speed; modest lengths also keep vLLM's API server responsive
# (tens of thousands of tokens made it answer other requests in seconds).
LONG_TOKENS = 1500
TESTBED_CONTEXT = 2048  # the prompt and LONG_TOKENS


async def vllm_models(vllm_url: str, http: httpx.AsyncClient | None = None) -> set[str]:
    """The names vLLM serves right now (adapters and the base model). Busy generating,
    its API server can take many seconds to answer, hence the long timeout."""
    async with contextlib.AsyncExitStack() as stack:
        if http is None:
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
        response = await http.get(f"{vllm_url}/v1/models")
        response.raise_for_status()
        return {entry["id"] for entry in response.json()["data"]}


async def direct(vllm: OpenAIClient, folder: Path, *, stream: bool = False,
                 **request: Any) -> Completion:
    """What vLLM itself answers for the adapter in ``folder``, loaded under a name of its
    own (no agent involved), then unloaded again."""
    name = f"direct-{secrets.token_hex(4)}"
    loaded = await vllm.http.post("/v1/load_lora_adapter",
                                  json={"lora_name": name, "lora_path": str(folder)})
    assert loaded.status_code == 200, loaded.text
    try:
        result = await (vllm.stream(name, **request) if stream
                        else vllm.complete(name, **request))
    finally:
        unloaded = await vllm.http.post("/v1/unload_lora_adapter", json={"lora_name": name})
        assert unloaded.status_code == 200, unloaded.text
    # Empty text from 16 greedy tokens means NaN logits (token 0 is a special token):
    # a broken server, and references from it would prove nothing.
    assert result.ok and result.text, result
    return result


async def served_by(client: OpenAIClient, model: str, version_name: str, *,
                    timeout_s: float = 30.0, texts: Mapping[str, str] | None = None,
                    **request: Any) -> Completion:
    """Ask ``model`` until ``version_name`` answers; that answer.

    With ``texts`` (versioned name -> its reference output), every answer on the way
    must succeed and be exactly its version's output: a swap fails no request and
    mixes no weights.
    """

    async def check() -> Completion | None:
        result = await client.complete(model, **request)
        if texts is not None and not (result.ok and result.adapter is not None
                                      and texts.get(result.adapter) == result.text):
            raise Unexpected(f"{model} answered {result} on the way to {version_name}")
        return result if result.ok and result.adapter == version_name else None

    return await eventually(check, timeout_s=timeout_s, retrying=RETRY_OVER_HTTP,
                            what=f"{model} served by {version_name} at {client.base_url}")


async def publish(api: AsyncRegistryClient, name: str, folder: Path, *,
                  aliases: Sequence[str] = ("live",), **kwargs: Any) -> int:
    """Push ``folder`` as a new version of ``name`` (made if needed), moving ``aliases``
    (``live`` unless told); its number."""
    pushed = await api.push(name, folder, aliases=aliases, **kwargs)
    assert pushed.created, pushed
    return pushed.version


async def new_adapter(api: AsyncRegistryClient, name: str, folder: Path) -> int:
    await api.create_adapter(name, "tiny-llama", tenant="e2e")
    return await publish(api, name, folder)


def delete_adapter(testbed: Testbed, name: str) -> None:
    """Delete ``name`` with the admin token (a benchmark's adapter, after its short run)."""

    async def delete() -> None:
        async with AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token,
                                       timeout_s=60) as api:
            await api.delete_adapter(name)

    asyncio.run(delete())


async def agent_report(api: AsyncRegistryClient, agent_id: str) -> AgentOut | None:
    """The registry's latest report of one agent, or None if it never reported."""
    listing = await api.list_agents()
    return next((a for a in listing.agents if a.agent_id == agent_id), None)


class HeldStream:
    """A stream through the agent whose answer the TCP proxy holds after its first text,
    until ``release``; then it runs to its natural end."""

    def __init__(self, client: OpenAIClient, model: str, tcp_proxy: PausableTcpProxy) -> None:
        self.first_chunk = asyncio.Event()
        self.tcp_proxy = tcp_proxy
        tcp_proxy.hold()
        self.task = asyncio.create_task(client.stream(
            model, prompt=HELD_PROMPT, max_tokens=LONG_TOKENS,
            first_chunk=self.first_chunk))

    async def started(self, timeout_s: float = 30.0) -> None:
        """Wait for the first text: the request then holds its lease on the version."""
        first = asyncio.create_task(self.first_chunk.wait())
        await asyncio.wait({first, self.task}, timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
        first.cancel()
        assert self.first_chunk.is_set(), (
            self.task.result() if self.task.done() else "no text within the time")
        assert self.tcp_proxy.held_connections >= 1, "the TCP proxy saw no marked request"

    def running(self) -> bool:
        return not self.task.done()

    async def release(self, timeout_s: float = 120.0) -> Completion:
        """Let the answer flow on; the whole stream, once it has ended."""
        self.tcp_proxy.release()
        return await asyncio.wait_for(self.task, timeout_s)


@contextlib.asynccontextmanager
async def held_stream(client: OpenAIClient, model: str,
                      tcp_proxy: PausableTcpProxy) -> AsyncIterator[HeldStream]:
    """A held stream that never outlives the block, however the test ends."""
    held = HeldStream(client, model, tcp_proxy)
    try:
        yield held
    finally:
        tcp_proxy.release()
        held.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await held.task


async def make_canary_due(testbed: Testbed, canary_id: int) -> None:
    """The step's window opened a day ago: the analyst judges it at its next look."""
    engine = create_async_engine(
        normalize_database_url(testbed.registry.settings["LORAPLANE_DATABASE_URL"]))
    try:
        async with engine.begin() as conn:
            await conn.execute(update(CanaryRow).where(CanaryRow.id == canary_id)
                               .values(step_started_at=utcnow() - timedelta(days=1)))
    finally:
        await engine.dispose()
