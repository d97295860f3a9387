"""The route table: which adapter version serves a request, decided synchronously.

Aliases map ``(adapter, alias)`` to a version with the revision of the move that put
it there; a move is applied only if its revision is newer, so late or duplicated
events cannot move an alias back. ``resolve`` has no await: the proxy resolves and
takes its lease in one step (see leases.py).

Every adapter belongs to one tenant, and a request is resolved for one tenant (its
inference token's): another tenant's adapter answers exactly as an unknown one, and
customer, task and default rules are looked up among that tenant's rules only. An
adapter whose tenant is not known yet is served to no one.

An alias under canary resolves per request: its canary version for the keys the sticky
split gives it (loraplane/canary_split.py: the customer, else the OpenAI ``user``), its
own version for the rest, and its own version for every request while the canary
version could not be loaded here. Such a request's ``Target`` names the canary and the
side it went to (``canary``), which the proxy counts for the registry (traffic.py).

Only the swap (control/swap.py) writes the table; everything else reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inference_agent.errors import NotServable
from loraplane.canary_split import takes_canary
from loraplane.events import DEFAULT_ROUTE_KEY, CanaryRoute, CanaryTrack, RouteRule, VersionRef
from loraplane.naming import DEFAULT_ALIAS, parse_model_ref, versioned_name

CUSTOMER_HEADER = "X-Customer-Id"
TASK_HEADER = "X-Task-Type"
# A request's headers and OpenAI ``user``: the canary split's key, read only when needed.
_Who = tuple[Mapping[str, str], str | None]
# The running canary a request of an alias under canary was split by, and its side.
CanarySide = tuple[int, CanaryTrack]


@dataclass(frozen=True)
class Target:
    """Where a request goes: an adapter version, or the base model (``adapter`` None).

    ``canary`` is set when an alias under canary decided it: the canary's id, and
    ``"canary"`` if the split sent the request to the canary version, ``"stable"`` if it
    kept it on the alias's own version (a canary not servable here included)."""

    adapter: str | None
    ref: VersionRef | None
    model_name: str
    canary: CanarySide | None = None

    @property
    def is_base(self) -> bool:
        return self.adapter is None


@dataclass(frozen=True)
class UnresolvedVersion:
    """``name@7`` where no alias points at 7: the caller looks version 7 up itself."""

    adapter: str
    version: int

    @property
    def model_name(self) -> str:
        return versioned_name(self.adapter, self.version)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None and isinstance(headers, dict):
        # Plain dicts are case-sensitive; HTTP header names are not. (Starlette's
        # Headers already look up without case: scanning them again only costs, and
        # a request without the header would pay it on every request.)
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    value = value.strip() if value is not None else None
    return value or None


class RouteTable:
    """Aliases and routing rules of one base model."""

    def __init__(self, base_model: str) -> None:
        self.base_model = base_model
        # adapter -> alias -> (revision, ref); a None ref is a removal kept as a
        # tombstone so an older move arriving late is still refused.
        self._aliases: dict[str, dict[str, tuple[int, VersionRef | None]]] = {}
        # (tenant, kind, key) -> rule; a tenant's default rule has the key "default".
        self._rules: dict[tuple[str, str, str], RouteRule] = {}
        self._owners: dict[str, str] = {}
        self._routed: dict[str, int] = {}
        # (adapter, alias) -> the canary on it, and whether it may be served here (a
        # version that failed to load is not: stable takes its share). Its version
        # counts as routed either way.
        self._canaries: dict[tuple[str, str], tuple[CanaryRoute, bool]] = {}

    # aliases

    def set_alias(self, adapter: str, alias: str, revision: int,
                  ref: VersionRef | None) -> bool:
        """Apply a move if ``revision`` is newer than the alias's; return whether it was."""
        table = self._aliases.setdefault(adapter, {})
        current = table.get(alias)
        if current is not None and revision <= current[0]:
            return False
        if current is not None and current[1] is not None:
            self._unroute(versioned_name(adapter, current[1].version))
        table[alias] = (revision, ref)
        if ref is not None:
            self._route(versioned_name(adapter, ref.version))
        return True

    def alias(self, adapter: str, alias: str) -> tuple[int, VersionRef | None]:
        """(revision, ref) of an alias; (0, None) if it never existed here."""
        return self._aliases.get(adapter, {}).get(alias, (0, None))

    def set_canary(self, adapter: str, alias: str, canary: CanaryRoute | None, *,
                   servable: bool = True) -> None:
        """The alias's canary (None: none), applied with the alias's revision by the
        swap; ``servable`` False keeps its share on the stable version."""
        old = self._canaries.pop((adapter, alias), None)
        if old is not None:
            self._unroute(versioned_name(adapter, old[0].target.version))
        if canary is None or canary.weight <= 0:
            return
        self._canaries[(adapter, alias)] = (canary, servable)
        self._route(versioned_name(adapter, canary.target.version))

    def canary(self, adapter: str, alias: str) -> CanaryRoute | None:
        held = self._canaries.get((adapter, alias))
        return held[0] if held is not None else None

    def canary_ids(self) -> set[int]:
        """The ids of the canaries running here (servable or not)."""
        return {canary.id for canary, _servable in self._canaries.values()}

    def held(self, adapter: str) -> dict[str, tuple[int, VersionRef | None]]:
        """Every alias's last move, removals (``None``) included, with its revision."""
        return dict(self._aliases.get(adapter, {}))

    def held_all(self) -> dict[str, dict[str, tuple[int, VersionRef | None]]]:
        """``held`` of every adapter: a copy made in C, cheap enough for the loop at
        hundreds of adapters (a status report filters it on a worker thread)."""
        return {adapter: dict(table) for adapter, table in self._aliases.items()}

    def aliases(self, adapter: str) -> dict[str, tuple[int, VersionRef]]:
        return {alias: (revision, ref)
                for alias, (revision, ref) in self._aliases.get(adapter, {}).items()
                if ref is not None}

    def adapters(self, tenant: str | None = None) -> set[str]:
        """Adapters with at least one alias pointing somewhere (of ``tenant``, if given)."""
        return {adapter for adapter in self._aliases if self.serves(adapter, tenant)}

    def serves(self, adapter: str, tenant: str | None = None) -> bool:
        """Whether ``adapter`` has an alias pointing somewhere (and is ``tenant``'s).
        One adapter's aliases, not every adapter's: asked on every request."""
        if tenant is not None and self._owners.get(adapter) != tenant:
            return False
        return any(ref is not None for _revision, ref in self._aliases.get(adapter, {}).values())

    # owners

    def set_owner(self, adapter: str, tenant: str) -> None:
        """Record the tenant ``adapter`` belongs to (names are unique across tenants)."""
        self._owners[adapter] = tenant

    def owner(self, adapter: str) -> str | None:
        return self._owners.get(adapter)

    def drop_adapter(self, adapter: str) -> None:
        """Forget an adapter entirely (deleted): a re-created one starts from revision 0."""
        self._owners.pop(adapter, None)
        for alias, (_revision, ref) in self._aliases.pop(adapter, {}).items():
            self.set_canary(adapter, alias, None)
            if ref is not None:
                self._unroute(versioned_name(adapter, ref.version))

    def routed_names(self) -> set[str]:
        return set(self._routed)

    def is_routed(self, name: str) -> bool:
        return name in self._routed

    def _route(self, name: str) -> None:
        self._routed[name] = self._routed.get(name, 0) + 1

    def _unroute(self, name: str) -> None:
        left = self._routed.get(name, 0) - 1
        if left > 0:
            self._routed[name] = left
        else:
            self._routed.pop(name, None)

    # rules

    def set_rules(self, rules: list[RouteRule], keep: frozenset[str] = frozenset()) -> None:
        """Replace every rule, except those of the tenants in ``keep`` (the table holds
        newer ones for them than ``rules``); rules for other base models are ignored."""
        kept = {k: r for k, r in self._rules.items() if k[0] in keep}
        self._rules = {(r.tenant, r.kind, r.key): r for r in rules
                       if r.base_model == self.base_model and r.tenant not in keep}
        self._rules.update(kept)

    def set_rule(self, tenant: str, kind: str, key: str, rule: RouteRule | None) -> None:
        """One rule's change: ``rule`` None (removed), for another base model or of
        another tenant than ``tenant`` drops it."""
        if rule is None or rule.base_model != self.base_model or rule.tenant != tenant \
                or (rule.kind, rule.key) != (kind, key):
            self._rules.pop((tenant, kind, key), None)
        else:
            self._rules[(tenant, kind, key)] = rule

    def rules(self) -> list[RouteRule]:
        return list(self._rules.values())

    # resolution

    def resolve(self, model: str | None, headers: Mapping[str, str], tenant: str,
                user: str | None = None) -> Target | UnresolvedVersion:
        """Decide what serves a request of ``tenant``; raise NotServable for an unknown
        adapter or alias, and for another tenant's adapter alike. ``user`` is the
        request's OpenAI ``user``: the canary split's key when no customer is named."""
        who = (headers, user)
        if not model or model == self.base_model:
            # The default rule stands in for a missing model only: a request naming the
            # base model gets it, unless a customer or task header routes it.
            return self._resolve_by_rules(headers, tenant, who, use_default=not model)
        parsed = parse_model_ref(model)
        if parsed is None:
            raise NotServable(f"the model {model!r} does not exist",
                              detail={"model": model})
        if not self.serves(parsed.adapter, tenant):
            raise NotServable(f"the adapter {parsed.adapter!r} is not served here",
                              detail={"model": model, "adapter": parsed.adapter})
        if parsed.version is not None:
            return self._by_version(parsed.adapter, parsed.version)
        return self._by_alias(parsed.adapter, parsed.alias or DEFAULT_ALIAS, who)

    def target_for(self, ref: VersionRef, canary: CanarySide | None = None) -> Target:
        return Target(adapter=ref.adapter, ref=ref,
                      model_name=versioned_name(ref.adapter, ref.version), canary=canary)

    def base_target(self) -> Target:
        return Target(adapter=None, ref=None, model_name=self.base_model)

    def _by_alias(self, adapter: str, alias: str, who: _Who) -> Target:
        _revision, ref = self.alias(adapter, alias)
        if ref is None:
            raise NotServable(f"the adapter {adapter!r} has no alias {alias!r}",
                              detail={"adapter": adapter, "alias": alias})
        return self._split(adapter, alias, ref, who)

    def _split(self, adapter: str, alias: str, ref: VersionRef, who: _Who) -> Target:
        held = self._canaries.get((adapter, alias))
        if held is None:  # the common case: no header read at all
            return self.target_for(ref)
        canary, servable = held
        headers, user = who
        if not servable or not takes_canary(_header(headers, CUSTOMER_HEADER) or user,
                                            canary.id, canary.weight):
            return self.target_for(ref, (canary.id, "stable"))
        return self.target_for(canary.target, (canary.id, "canary"))

    def _by_version(self, adapter: str, version: int) -> Target | UnresolvedVersion:
        for _revision, ref in self.aliases(adapter).values():
            if ref.version == version:
                return self.target_for(ref)
        for (owner, _alias), (canary, _servable) in self._canaries.items():
            if owner == adapter and canary.target.version == version:
                return self.target_for(canary.target)
        return UnresolvedVersion(adapter, version)

    def _resolve_by_rules(self, headers: Mapping[str, str], tenant: str, who: _Who,
                          *, use_default: bool = True) -> Target:
        for kind, header in (("customer", CUSTOMER_HEADER), ("task", TASK_HEADER)):
            value = _header(headers, header)
            rule = self._rules.get((tenant, kind, value)) if value is not None else None
            if rule is not None:
                return self._rule_target(rule, tenant, who)
        default = self._rules.get((tenant, "default", DEFAULT_ROUTE_KEY))
        if default is not None and use_default:
            return self._rule_target(default, tenant, who)
        return self.base_target()

    def _rule_target(self, rule: RouteRule, tenant: str, who: _Who) -> Target:
        _revision, ref = self.alias(rule.adapter, rule.alias)
        # The requester's tenant, not the rule's: whatever a rule says, a request
        # reaches only its own tenant's adapters.
        if ref is None or self._owners.get(rule.adapter) != tenant:
            # A rule naming something not served is an operator error; answering from
            # the base model instead would hide it behind plausible output.
            raise NotServable(
                f"the {rule.kind} route {rule.key!r} names {rule.adapter}@{rule.alias}, "
                "which is not served here",
                detail={"kind": rule.kind, "key": rule.key, "adapter": rule.adapter,
                        "alias": rule.alias})
        return self._split(rule.adapter, rule.alias, ref, who)
