"""The guest's idle polling, for benchmarks that ask what waking from idle costs.

These machines are KVM guests (Firecracker) booted with the ``haltpoll`` cpuidle
driver and ``haltpoll.guest_halt_poll_ns=0``: an idle vCPU halts at once, leaves the
guest (a VM exit) and gives its physical core back to the host, so the next wake-up
goes through the host's scheduler and finds the core's caches in another state. With
``guest_halt_poll_ns`` set, an idle vCPU first polls up to that long before halting.
A bench can alternate its rounds between the machine's setting and a polling one to
show how much of a process's cost per wake-up is the halt. This is a setting of the
machine, not of loraplane: on a host that is not a guest there is no VM exit at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

PARAMETERS = Path("/sys/module/haltpoll/parameters")
# Polls a full window at once, and keeps it (no shrinking after a long idle).
_POLL_KEYS = ("guest_halt_poll_ns", "guest_halt_poll_grow_start",
              "guest_halt_poll_allow_shrink")


class HaltPollUnavailable(RuntimeError):
    """The machine has no writable haltpoll parameters (not a guest, or not root)."""


class HaltPoll:
    """Reads the machine's haltpoll parameters, sets polling on demand, and restores
    what it found."""

    def __init__(self, parameters: Path = PARAMETERS) -> None:
        self.parameters = parameters
        try:
            self.found = {key: (parameters / key).read_text().strip() for key in _POLL_KEYS}
        except OSError as exc:
            raise HaltPollUnavailable(
                f"no haltpoll parameters to read at {parameters}: {exc}") from exc
        try:
            self._write(self.found)  # unchanged: refused here, not in the middle of a run
        except OSError as exc:
            raise HaltPollUnavailable(f"cannot write {parameters}: {exc}") from exc

    def _write(self, values: dict[str, str]) -> None:
        for key, value in values.items():
            (self.parameters / key).write_text(value)

    def poll(self, ns: int) -> None:
        """An idle vCPU polls up to ``ns`` before it halts."""
        self._write({"guest_halt_poll_ns": str(ns), "guest_halt_poll_grow_start": str(ns),
                     "guest_halt_poll_allow_shrink": "N"})

    def restore(self) -> None:
        self._write(self.found)

    @contextlib.contextmanager
    def restored(self) -> Iterator[HaltPoll]:
        """This object, with the machine's own setting put back however the block ends."""
        try:
            yield self
        finally:
            self.restore()
