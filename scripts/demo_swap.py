"""The demo's scenario: v1 serving, v2 pushed (stored, not served), a long v1 stream,
v2 promoted under it, a timeline.

Every observation is taken from outside, as a user would: the answers' headers and
text (through the agent), vLLM's own model list, and the registry's events on NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import nats
from nats.aio.msg import Msg

from devharness.openai_client import RETRY_OVER_HTTP, Completion, OpenAIClient
from devharness.waiting import eventually
from loraplane.api import UploadResult
from loraplane.client import AsyncRegistryClient
from loraplane.events import STREAM_SUBJECTS, AdapterUpdated, Event, parse_event
from loraplane.nats_auth import NatsSecurity

BASE_MODEL = "tiny-llama"
ADAPTER = "support-bot"
V1, V2 = f"{ADAPTER}@1", f"{ADAPTER}@2"
# Long enough to outlast a promote and its swap (the agent's download and vLLM's load) on
# a busy 2-core machine; the upload is done before the stream starts, as `loraplane push`
# then `loraplane promote` do. vLLM runs with --max-model-len 2048.
STREAM_TOKENS = 1800
STREAM_PROMPT = "Dear support team, my order has not arrived and"
POLL_INTERVAL_S = 0.1


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and why."""


class CliRunner(Protocol):
    def run(self, *args: str) -> None: ...

    def api(self) -> AsyncRegistryClient:
        """The same registry, as the same user, over its REST API."""
        ...

def step(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


@dataclass
class Timeline:
    """What happened when, in milliseconds from ``origin``."""

    origin: float = field(default_factory=time.monotonic)
    marks: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, what: str, at: float | None = None) -> None:
        self.marks.append((time.monotonic() if at is None else at, what))

    def ms(self, at: float) -> int:
        return round((at - self.origin) * 1000)

    def lines(self) -> list[str]:
        return [f"  +{self.ms(at):>7,} ms  {what}" for at, what in sorted(self.marks)]


class EventWatch:
    """Every registry event on NATS, with the moment it arrived here."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, Event]] = []
        self.v2_seen = asyncio.Event()
        # Events carry the registry's wall-clock commit time; the timeline is monotonic.
        self.wall_to_monotonic = time.monotonic() - time.time()
        self._client: Any = None

    async def start(self, url: str, security: NatsSecurity | None = None) -> None:
        async def record(msg: Msg) -> None:
            event = parse_event(msg.data)
            self.seen.append((time.monotonic(), event))
            if isinstance(event, AdapterUpdated) and (event.adapter, event.version) == (
                    ADAPTER, 2):
                self.v2_seen.set()

        options = security.connect_options() if security is not None else {}
        self._client = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=3,
                                          **options)
        # A plain subscription: JetStream stores these subjects; the embedded server lets
        # its registry user listen (loraplane/nats_permissions.py).
        await self._client.subscribe(STREAM_SUBJECTS, cb=record)

    def committed_at(self, event: Event) -> float:
        return event.time.timestamp() + self.wall_to_monotonic

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.drain()


class VllmWatch:
    """vLLM's model list, polled: when each name first appeared and when it left."""

    def __init__(self, vllm_url: str) -> None:
        self.http = httpx.AsyncClient(base_url=vllm_url, timeout=10)
        self.appeared: dict[str, float] = {}
        self.left: dict[str, float] = {}
        self._present: set[str] = set()

    async def run(self) -> None:
        while True:
            try:
                response = await self.http.get("/v1/models")
                response.raise_for_status()
            except httpx.HTTPError:
                # One slow answer on a loaded machine must not end the watch (it did, and
                # the demo missed the unload it is there to see): poll again.
                await asyncio.sleep(POLL_INTERVAL_S)
                continue
            now, names = time.monotonic(), {m["id"] for m in response.json()["data"]}
            for name in names - self._present:
                self.appeared.setdefault(name, now)
            for name in self._present - names:
                self.left.setdefault(name, now)
            self._present = names
            await asyncio.sleep(POLL_INTERVAL_S)


async def served_by(agent: OpenAIClient, version_name: str, timeout_s: float) -> Completion:
    async def check() -> Completion | None:
        answer = await agent.complete(ADAPTER)
        return answer if answer.ok and answer.adapter == version_name else None

    try:
        return await eventually(check, timeout_s=timeout_s, retrying=RETRY_OVER_HTTP,
                                what=f"the agent answering with {version_name}")
    except AssertionError as exc:
        raise DemoError(str(exc)) from None


@dataclass
class Swap:
    """What the requests sent during the swap saw."""

    answered: Counter[str] = field(default_factory=Counter)
    failed: list[Completion] = field(default_factory=list)
    first_v2: Completion | None = None
    committed_at: float | None = None  # the registry's commit of v2 (monotonic)


async def poll_until_v2(agent: OpenAIClient, move: asyncio.Task[Any], swap: Swap,
                        timeline: Timeline, timeout_s: float = 90.0) -> Completion:
    """New requests, one after another, until one is answered by v2. Each is streamed, so
    its headers tell which version serves it as soon as it is served."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if move.done() and move.exception() is not None:
            raise DemoError(f"promoting v2 failed: {move.exception()}")
        answer = await agent.stream(ADAPTER, max_tokens=16)
        if not answer.ok:
            swap.failed.append(answer)
        else:
            swap.answered[answer.adapter or "?"] += 1
        if answer.ok and answer.adapter == V2:
            timeline.mark(f"agent: first request served by {V2} (before it, "
                          f"{swap.answered[V1]} answered by {V1} since the event)",
                          answer.answered_at)
            swap.first_v2 = answer
            return answer
        await asyncio.sleep(POLL_INTERVAL_S)
    raise DemoError(f"no request was answered by {V2} within {timeout_s:.0f}s")


async def published(events: EventWatch, move: asyncio.Task[Any], timeout_s: float) -> None:
    """Until v2's event is on NATS (or the promote answered, whichever comes first)."""
    seen = asyncio.create_task(events.v2_seen.wait())
    try:
        done, _ = await asyncio.wait({seen, move}, timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        seen.cancel()
    if not done:
        raise DemoError(f"promoting v2 took more than {timeout_s:.0f}s")
    if move.done() and move.exception() is not None:
        raise DemoError(f"promoting v2 failed: {move.exception()}")


async def promote(api: AsyncRegistryClient, timeline: Timeline) -> None:
    # The move `loraplane promote support-bot 2 --alias live` makes, sent from this process:
    # on 2 cores under a running stream, starting a new process took 3-10 s.
    state = await api.move_alias(ADAPTER, "live", 2)
    timeline.mark(f"the promote answered: live -> {state.version} (revision {state.revision})")


async def push_v2(api: AsyncRegistryClient, folder: Path) -> UploadResult:
    # The upload `loraplane push support-bot a2` makes, from this process.
    print(f"$ loraplane push {ADAPTER} {folder.name}")
    result = await api.push(ADAPTER, folder)
    if not result.created or result.version != 2 or result.aliases:
        raise DemoError(f"the push did not store version 2 without serving it: {result}")
    print(f"version 2 stored; serve it: loraplane promote {ADAPTER} 2 --alias live")
    return result


async def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    try:
        await eventually(condition, timeout_s=timeout_s, retrying=RETRY_OVER_HTTP,
                         interval_s=0.05, what=what)
    except AssertionError as exc:
        raise DemoError(str(exc)) from None


async def swap_under_stream(api: AsyncRegistryClient, agent: OpenAIClient,
                            watches: tuple[EventWatch, VllmWatch], timeline: Timeline,
                            swap: Swap) -> Completion:
    events, vllm = watches
    first_chunk = asyncio.Event()
    timeline.origin = time.monotonic()
    timeline.mark(f"stream started on {ADAPTER}: {STREAM_TOKENS} tokens, greedy")
    stream = asyncio.create_task(agent.stream(ADAPTER, prompt=STREAM_PROMPT,
                                              max_tokens=STREAM_TOKENS, first_chunk=first_chunk))
    try:
        await asyncio.wait_for(first_chunk.wait(), 60)
        timeline.mark("stream: first token arrived")
        timeline.mark(f"promote of v2 started (PUT /v1/adapters/{ADAPTER}/aliases/live, "
                      f"the move `loraplane promote {ADAPTER} 2 --alias live` makes)")
        move = asyncio.create_task(promote(api, timeline))
        # Requests before the event could only be v1: they would just slow the move down.
        await published(events, move, timeout_s=60)
        first_v2 = await poll_until_v2(agent, move, swap, timeline)
        await move
        result = await stream
    finally:
        stream.cancel()
    timeline.mark(f"stream finished: X-Loraplane-Adapter {result.adapter}, "
                  f"{tokens(result)}", result.ended)
    # Served by v2 (its headers name it) while the v1 stream still ran: the swap happened
    # under the stream.
    if first_v2.answered_at >= (result.ended or 0):
        raise DemoError("the stream ended before v2 was served: the swap happened after it")
    await wait_for(lambda: V1 in vllm.left, 30, f"{V1} unloaded from vLLM after its stream")
    return result


def tokens(answer: Completion) -> str:
    # vLLM may put several tokens in one chunk; "length" means max_tokens were made.
    made = f"{STREAM_TOKENS} tokens" if answer.finish_reason == "length" else "tokens"
    return f"{made} in {answer.chunks} chunks (finish_reason {answer.finish_reason})"


def mark_observations(timeline: Timeline, events: EventWatch, vllm: VllmWatch,
                      swap: Swap) -> None:
    for at, event in events.seen:
        if at >= timeline.origin and isinstance(event, AdapterUpdated):
            if (event.adapter, event.version) == (ADAPTER, 2):
                swap.committed_at = events.committed_at(event)
            move = f"{event.adapter}@{event.alias} {event.previous_version} -> {event.version}"
            timeline.mark(f"v2 promoted: the registry committed the move ({move})",
                          events.committed_at(event))
            timeline.mark(f"NATS: {event.type} {move} (stream seq {event.seq}) "
                          "reached a subscriber", at)
    if V2 in vllm.appeared:
        timeline.mark(f"vLLM: {V2} loaded, beside {V1}", vllm.appeared[V2])
    if V1 in vllm.left:
        timeline.mark(f"vLLM: {V1} unloaded (drained: its last request has ended)",
                      vllm.left[V1])


def verdict(stream: Completion, reference: Completion, v1_answer: Completion,
            swap: Swap) -> list[str]:
    """Readable results; raises DemoError naming every promise that did not hold."""
    same = stream.text == reference.text
    first_v2 = swap.first_v2
    lines = []
    if first_v2 is not None and first_v2.ended and swap.committed_at is not None:
        lines.append(f"v2 first served {(first_v2.answered_at - swap.committed_at) * 1000:,.0f} "
                     "ms after the registry committed it, while the v1 stream ran on")
    lines += [
        f"the v1 stream: status {stream.status}, X-Loraplane-Adapter {stream.adapter}, "
        f"{tokens(stream)}, {stream.seconds:.1f}s",
        f"its text equals the undisturbed v1 run ({reference.seconds:.1f}s): "
        f"{'yes' if same else 'NO'}",
        f"requests during the swap: {sum(swap.answered.values())} answered "
        f"({', '.join(f'{n} by {v}' for v, n in sorted(swap.answered.items()))}), "
        f"{len(swap.failed)} failed",
        f"v2 answers differently from v1 to the same prompt: "
        f"{'yes' if first_v2 is not None and first_v2.text != v1_answer.text else 'NO'}",
    ]
    broken = []
    if not (stream.ok and stream.adapter == V1 and stream.finish_reason == "length"):
        broken.append(f"the stream did not finish on {V1}: {stream}")
    if not same:
        broken.append("the stream's text differs from the undisturbed v1 run")
    if swap.failed:
        broken.append(f"requests failed during the swap: {[str(f) for f in swap.failed]}")
    if first_v2 is None or first_v2.text == v1_answer.text:
        broken.append("v2's answer is the same as v1's: the weights did not change")
    if broken:
        print("\n".join(lines))
        raise DemoError("; ".join(broken))
    return lines


async def run_scenario(cli: CliRunner, agent_url: str, vllm_url: str, nats_url: str,
                       adapters: Path, nats_security: NatsSecurity | None = None) -> None:
    step("create the adapter and publish v1")
    cli.run("adapters", "create", ADAPTER, "--base-model", BASE_MODEL, "--tenant", "acme",
            "--description", "first-line support")
    cli.run("push", ADAPTER, str(adapters / "a1"), "--alias", "live")
    step("an inference token for acme's clients: the agent answers nobody without one")
    async with cli.api() as api:
        client_token = (await api.create_token("demo-client", "inference",
                                               tenant="acme")).secret
    print("$ loraplane token create demo-client --role inference --tenant acme")
    events, vllm = EventWatch(), VllmWatch(vllm_url)
    await events.start(nats_url, nats_security)
    watcher = asyncio.create_task(vllm.run())
    try:
        async with OpenAIClient(agent_url, token=client_token) as agent, cli.api() as api:
            await _scenario(api, agent, adapters, events, vllm, watcher)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await watcher
        await vllm.http.aclose()
        await events.stop()
    step("what the registry knows: versions, the fleet, the rollout")
    cli.run("versions", ADAPTER)
    cli.run("agents")
    cli.run("rollout", ADAPTER)


async def _scenario(api: AsyncRegistryClient, agent: OpenAIClient, adapters: Path,
                    events: EventWatch, vllm: VllmWatch, watcher: asyncio.Task[None]) -> None:
    step(f"wait until the agent serves v1 (POST /v1/completions model={ADAPTER})")
    started = time.monotonic()
    v1_answer = await served_by(agent, V1, timeout_s=60)
    print(f"answered by {v1_answer.adapter} after {time.monotonic() - started:.2f}s: "
          f"{v1_answer.text!r}")
    step(f"reference: an undisturbed v1 stream ({STREAM_TOKENS} tokens, greedy)")
    reference = await agent.stream(ADAPTER, prompt=STREAM_PROMPT, max_tokens=STREAM_TOKENS)
    if not (reference.ok and reference.adapter == V1):
        raise DemoError(f"the reference stream was not served by {V1}: {reference}")
    print(f"{reference.adapter}: {tokens(reference)}, {reference.seconds:.1f}s")
    step("push v2: stored, not served until an alias moves to it")
    await push_v2(api, adapters / "a2")
    step("the same stream again, and v2 promoted while it runs")
    timeline, swap = Timeline(), Swap()
    try:
        stream = await swap_under_stream(api, agent, (events, vllm), timeline, swap)
        if watcher.done() and watcher.exception() is not None:
            raise DemoError(f"watching vLLM's model list failed: {watcher.exception()}")
    finally:
        # Also on a failure: what happened up to it is the best clue.
        mark_observations(timeline, events, vllm, swap)
        step("timeline (milliseconds from the start of the stream)")
        print("\n".join(timeline.lines()))
    step("result")
    print("\n".join(verdict(stream, reference, v1_answer, swap)))
