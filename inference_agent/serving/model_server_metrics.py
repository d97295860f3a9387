"""The model-server protocol on the agent's ``/metrics``: what llm-d's endpoint picker reads.

When a gateway scrapes the agent instead of vLLM, the agent answers the series the
Gateway API Inference Extension's model-server protocol names (and llm-d's router reads
for its ``vllm`` engine): ``vllm:lora_requests_info`` from the agent's own state, and
vLLM's queue, KV-cache and cache-config series from the copy ``VllmMetricsMirror`` keeps.
Rendering reads memory, and asks vLLM only when that copy is older than its interval.
``/metrics`` carries them after the agent's own metrics; ``MODEL_SERVER_METRICS_PATH``
carries them alone, for a picker scraping many times a second (the agent's own
histograms cost most of a ``/metrics`` render).

``vllm:lora_requests_info`` as the picker parses it: of the series of that family it
takes the one with the highest value (vLLM sets it to the time of its update), splits
``running_lora_adapters`` and ``waiting_lora_adapters`` on commas and matches each name
exactly against the request's ``model``, and reads ``max_lora`` as an integer. Its LoRA
affinity scorer gives 1.0 when the model is running, else 0.8 when the running and
waiting names together are fewer than ``max_lora``, else 0.6 when it is waiting, else 0.

What the agent puts there, unlike vLLM (which lists only adapters with a request in the
batch, so a warm idle adapter looks cold):

- ``running_lora_adapters``: every version loaded in vLLM by this agent, busy or idle,
  under every name the agent's OpenAI front door accepts for it as ``model``: ``name``
  (when ``live`` points at it), ``name@alias`` for each alias pointing at it, and
  ``name@N``.
- ``waiting_lora_adapters``: versions whose load is in flight (requests for them wait on
  that load), under the same names.
- ``max_lora``: the names listed plus one per free slot of ``--max-loaded``. The scorer
  compares a count of *names* with ``max_lora``, and a version has several names, so
  the agent's capacity in versions is expressed in names: "fewer names than max_lora"
  then holds exactly when a slot is free.
- the value: the Unix time at which this set of labels was first rendered. There is one
  series, so the picker's "newest" is always it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

from inference_agent.node.vllm_metrics import VllmMetricsMirror
from inference_agent.serving.routes import RouteTable
from loraplane.naming import DEFAULT_ALIAS

LORA_INFO = "vllm:lora_requests_info"
# Where the agent serves these series alone (``/metrics`` has them too, after the
# agent's own): the path to give a gateway's picker, which scrapes many times a second.
MODEL_SERVER_METRICS_PATH = "/metrics/model-server"
_HELP = ("Adapter versions this agent has loaded in vLLM (running, busy or idle) and is "
         "loading (waiting), by every name clients use; max_lora counts names")


class LoadedVersions(Protocol):
    """What the adapter cache tells about vLLM's loaded set (node/cache.py)."""

    capacity: int

    def loaded_names(self) -> list[str]: ...

    def loading_names(self) -> list[str]: ...


def client_names(routes: RouteTable, versioned: str) -> list[str]:
    """Every ``model`` the front door resolves to the version ``adapter@N``."""
    adapter, _sep, number = versioned.rpartition("@")
    names = [versioned]
    if not number.isdigit():
        return names
    for alias, (_revision, ref) in sorted(routes.aliases(adapter).items()):
        if ref.version == int(number):
            if alias == DEFAULT_ALIAS:
                names.append(adapter)
            names.append(f"{adapter}@{alias}")
    return names


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


class ModelServerMetrics:
    """Renders the protocol's series; ``render`` is appended to the agent's /metrics."""

    def __init__(self, routes: RouteTable, cache: LoadedVersions,
                 mirror: VllmMetricsMirror | None, *,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.routes = routes
        self.cache = cache
        self.mirror = mirror
        self._wall_clock = wall_clock
        self._labels: tuple[str, str, str] | None = None
        self._since = 0.0

    def lora_labels(self) -> tuple[str, str, str]:
        """(running, waiting, max_lora) label values as they stand now."""
        running = self._names(self.cache.loaded_names())
        waiting = self._names(self.cache.loading_names())
        versions = len(self.cache.loaded_names()) + len(self.cache.loading_names())
        free = max(0, self.cache.capacity - versions)
        return ",".join(running), ",".join(waiting), str(len(running) + len(waiting) + free)

    def _names(self, versioned: Iterable[str]) -> list[str]:
        return [name for version in sorted(versioned)
                for name in client_names(self.routes, version)]

    def lora_info(self) -> str:
        labels = self.lora_labels()
        if labels != self._labels:
            self._labels, self._since = labels, self._wall_clock()
        running, waiting, max_lora = (_label_value(v) for v in labels)
        return (f"# HELP {LORA_INFO} {_HELP}\n# TYPE {LORA_INFO} gauge\n"
                f'{LORA_INFO}{{max_lora="{max_lora}",running_lora_adapters="{running}",'
                f'waiting_lora_adapters="{waiting}"}} {self._since!r}\n')

    async def render(self) -> bytes:
        passed = await self.mirror.current() if self.mirror is not None else ""
        return (self.lora_info() + passed).encode()
