"""What the reconciler asks of the swap.

The reconciler decides and the swap acts: ``AliasApplier`` is everything the reconciler
may do to the served state, and the swap (``Swapper``) is its only implementation, so it
is the only writer of the route table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from loraplane.events import CanaryRoute, RouteRule, VersionRef

# How far the swap takes a new version before its alias flips to it, as the reconciler
# decided: "hot" loads it into vLLM (the adapter is loaded now, or kept hot here),
# "warm" fetches and validates it into the disk cache, "cold" runs only the checks that
# need no download; a cold version is fetched, validated and loaded at its first request.
Readiness = Literal["hot", "warm", "cold"]


@dataclass
class SwapResult:
    adapter: str
    alias: str
    old: int | None
    new: int | None
    loaded: bool
    flipped: bool


class AliasApplier(Protocol):
    """The writes to the served state (the route table), all made by the swap."""

    async def apply(self, adapter: str, alias: str, revision: int,
                    ref: VersionRef | None, ready: Readiness = "warm",
                    canary: CanaryRoute | None = None) -> SwapResult:
        """Move an alias (None removes it) and set its canary, with ``ref`` and the
        canary's version made ``ready`` first; raise, changing nothing, if ``ref``
        fails (a canary that fails is kept off the route instead)."""
        ...

    def record(self, adapter: str, alias: str, revision: int, ref: VersionRef) -> None:
        """The alias already serves ``ref``: only take the newer revision."""
        ...

    def drop_adapter(self, adapter: str) -> None:
        """Forget the adapter, revisions included (it was deleted)."""
        ...

    async def recount_disk(self) -> None:
        """Count the disk cache again and evict what it holds over budget."""
        ...

    def set_rules(self, rules: list[RouteRule], keep: frozenset[str] = frozenset()) -> None:
        """Replace the routing rules, but those of the tenants in ``keep``."""
        ...

    def set_rule(self, tenant: str, kind: str, key: str, rule: RouteRule | None) -> None:
        """Change one routing rule (None: remove it)."""
        ...

    def set_owner(self, adapter: str, tenant: str) -> None:
        """Record the tenant the adapter belongs to: only its requests may use it."""
        ...
