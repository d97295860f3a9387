"""Reading a canary's outcome through the registry's API, for the fleet's tests."""

from __future__ import annotations

from devharness.waiting import Unexpected, eventually
from loraplane.api.canaries import Canary
from loraplane.client import AsyncRegistryClient

# Generous: a step is judged within a few seconds here, far slower on a busy machine.
END_TIMEOUT_S = 240.0


async def latest(api: AsyncRegistryClient, name: str) -> Canary:
    return (await api.list_canaries(name)).canaries[0]


async def ended(api: AsyncRegistryClient, name: str, state: str) -> Canary:
    """Wait until the canary of ``name@live`` is ``state``; fail at once if it ends
    otherwise."""

    async def check() -> Canary | None:
        canary = await latest(api, name)
        if canary.state == state:
            return canary
        if canary.state in {"promoted", "aborted"}:
            raise Unexpected(f"the canary ended {canary.state}: {canary.reason}")
        return None

    return await eventually(check, timeout_s=END_TIMEOUT_S, interval_s=0.25,
                            what=f"the canary {state}")


async def live_version(api: AsyncRegistryClient, name: str) -> int | None:
    return next(a.version for a in (await api.get_adapter(name)).aliases if a.alias == "live")


async def moves(api: AsyncRegistryClient, name: str) -> list[tuple[str, str, int | None]]:
    """The alias's moves, oldest first: action, actor, the version it went to."""
    history = await api.alias_history(name)
    return [(m.action, m.actor, m.to_version) for m in reversed(history.moves)]
