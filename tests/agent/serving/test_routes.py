"""RouteTable: every resolution rule, and revision ordering of alias moves."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
from starlette.datastructures import Headers

from inference_agent.errors import NotServable
from inference_agent.serving.routes import CUSTOMER_HEADER, RouteTable, Target, UnresolvedVersion
from loraplane.canary_split import takes_canary
from loraplane.events import CanaryRoute, RouteKind, RouteRule, VersionRef

BASE = "tiny-llama"
TENANT = "acme"


def ref(adapter: str, version: int) -> VersionRef:
    return VersionRef(adapter=adapter, version=version, digest=f"{version:064x}",
                      base_model=BASE, rank=8, alpha=16, target_modules=["q_proj"], files=[])


def rule(kind: RouteKind, key: str, adapter: str, alias: str = "live",
         base_model: str = BASE, tenant: str = TENANT) -> RouteRule:
    return RouteRule(kind=kind, key=key, adapter=adapter, alias=alias, tenant=tenant,
                     base_model=base_model)


@pytest.fixture
def table() -> RouteTable:
    routes = RouteTable(BASE)
    for adapter in ("bot", "sum"):
        routes.set_owner(adapter, TENANT)
    assert routes.set_alias("bot", "live", 1, ref("bot", 3))
    assert routes.set_alias("bot", "canary", 1, ref("bot", 4))
    assert routes.set_alias("sum", "live", 1, ref("sum", 1))
    return routes


def name_of(result: Target | UnresolvedVersion) -> str:
    return result.model_name


def test_model_forms(table: RouteTable) -> None:
    assert name_of(table.resolve("bot", {}, TENANT)) == "bot@3"
    assert name_of(table.resolve("bot@live", {}, TENANT)) == "bot@3"
    assert name_of(table.resolve("bot@canary", {}, TENANT)) == "bot@4"
    target = table.resolve("bot@4", {}, TENANT)
    assert isinstance(target, Target) and target.ref == ref("bot", 4)
    assert table.resolve("bot@9", {}, TENANT) == UnresolvedVersion("bot", 9)
    assert table.target_for(ref("bot", 9)).model_name == "bot@9"


@pytest.mark.parametrize("model", [None, "", BASE])
def test_base_model_without_rules(table: RouteTable, model: str | None) -> None:
    target = table.resolve(model, {}, TENANT)
    assert isinstance(target, Target) and target.is_base
    assert target.model_name == BASE and target.ref is None


@pytest.mark.parametrize("model", ["nope", "nope@live", "nope@3", "bot@nope", "Bad!", "bot@"])
def test_unknown_adapter_alias_or_garbage_is_not_servable(table: RouteTable,
                                                          model: str) -> None:
    with pytest.raises(NotServable):
        table.resolve(model, {}, TENANT)


def test_rules_customer_then_task_then_default_then_base(table: RouteTable) -> None:
    table.set_rules([rule("customer", "c1", "bot", "canary"), rule("task", "summarize", "sum"),
                     rule("default", "default", "bot")])
    both = {"X-Customer-Id": "c1", "X-Task-Type": "summarize"}
    assert name_of(table.resolve(None, both, TENANT)) == "bot@4"
    assert name_of(table.resolve(None, {"x-task-type": "summarize"}, TENANT)) == "sum@1"
    assert name_of(table.resolve(None, {"X-Customer-Id": "other"}, TENANT)) == "bot@3"
    # Naming the base model asks for the base model: the default rule stands in for a
    # missing model only; a customer or task header still routes.
    assert name_of(table.resolve(BASE, {"X-Customer-Id": "other"}, TENANT)) == BASE
    assert name_of(table.resolve(BASE, {"X-Customer-Id": "c1"}, TENANT)) == "bot@4"
    # An explicit adapter wins over every header rule.
    assert name_of(table.resolve("sum", {"X-Customer-Id": "c1"}, TENANT)) == "sum@1"
    table.set_rules([rule("customer", "c1", "bot", "canary")])
    target = table.resolve(None, {"X-Customer-Id": "c2"}, TENANT)
    assert isinstance(target, Target) and target.is_base


def test_rule_headers_match_without_case_in_a_request_headers_too(table: RouteTable) -> None:
    table.set_rules([rule("customer", "c1", "bot", "canary"), rule("task", "summarize", "sum")])
    # As the proxy passes them: Starlette's Headers over the ASGI scope's lowercased names.
    headers = Headers(raw=[(b"x-customer-id", b" c1 "), (b"x-task-type", b"summarize")])
    assert name_of(table.resolve(None, headers, TENANT)) == "bot@4"
    headers = Headers(raw=[(b"accept", b"*/*"), (b"x-task-type", b"summarize")])
    assert name_of(table.resolve(None, headers, TENANT)) == "sum@1"


def test_rules_for_another_base_model_are_ignored(table: RouteTable) -> None:
    table.set_rules([rule("default", "default", "bot", base_model="other-model")])
    assert name_of(table.resolve(None, {}, TENANT)) == BASE
    table.set_rules([rule("default", "default", "sum")])
    assert name_of(table.resolve(None, {}, TENANT)) == "sum@1"
    table.set_rules([rule("default", "default", "sum", base_model="other-model")])
    assert name_of(table.resolve(None, {}, TENANT)) == BASE, "replaced by another model's rule"


def test_a_rule_naming_an_alias_not_served_is_not_servable(table: RouteTable) -> None:
    table.set_rules([rule("task", "t", "bot", "beta")])
    with pytest.raises(NotServable, match="bot@beta"):
        table.resolve(None, {"X-Task-Type": "t"}, TENANT)


def test_moves_apply_only_with_a_newer_revision(table: RouteTable) -> None:
    assert not table.set_alias("bot", "live", 1, ref("bot", 9))  # duplicate revision
    assert table.set_alias("bot", "live", 5, ref("bot", 5))
    assert not table.set_alias("bot", "live", 4, ref("bot", 4))  # late, older event
    assert table.alias("bot", "live") == (5, ref("bot", 5))
    assert name_of(table.resolve("bot", {}, TENANT)) == "bot@5"


def test_removal_is_a_tombstone_and_drop_adapter_forgets(table: RouteTable) -> None:
    assert table.set_alias("bot", "canary", 2, None)
    assert table.alias("bot", "canary") == (2, None)
    assert not table.set_alias("bot", "canary", 1, ref("bot", 4))  # cannot resurrect
    assert set(table.aliases("bot")) == {"live"}
    with pytest.raises(NotServable):
        table.resolve("bot@canary", {}, TENANT)
    table.drop_adapter("bot")
    assert table.adapters() == {"sum"}
    with pytest.raises(NotServable):
        table.resolve("bot", {}, TENANT)
    assert table.set_alias("bot", "live", 1, ref("bot", 1))  # a re-created adapter


def test_routed_names_follow_every_alias(table: RouteTable) -> None:
    assert table.routed_names() == {"bot@3", "bot@4", "sum@1"}
    table.set_alias("bot", "canary", 2, ref("bot", 3))  # both aliases on bot@3
    assert table.routed_names() == {"bot@3", "sum@1"}
    table.set_alias("bot", "live", 2, ref("bot", 5))
    assert table.is_routed("bot@3") and table.is_routed("bot@5")
    table.set_alias("bot", "canary", 3, None)
    assert not table.is_routed("bot@3")
    table.drop_adapter("sum")
    assert table.routed_names() == {"bot@5"}


def test_a_request_sees_only_its_tenants_adapters(table: RouteTable) -> None:
    table.set_owner("other", "globex")
    assert table.set_alias("other", "live", 1, ref("other", 2))
    assert name_of(table.resolve("other", {}, "globex")) == "other@2"
    assert table.adapters("globex") == {"other"} and table.adapters(TENANT) == {"bot", "sum"}
    for model in ("other", "other@live", "other@2", "other@7"):
        with pytest.raises(NotServable) as refused:
            table.resolve(model, {}, TENANT)
        assert refused.value.message == "the adapter 'other' is not served here"
    for model in ("bot", "bot@3", "bot@9"):
        with pytest.raises(NotServable):
            table.resolve(model, {}, "globex")
    # An adapter whose tenant is not known yet is served to no one.
    assert table.set_alias("orphan", "live", 1, ref("orphan", 1))
    with pytest.raises(NotServable):
        table.resolve("orphan", {}, TENANT)


def test_rules_resolve_within_the_requests_tenant_only(table: RouteTable) -> None:
    """Fails on the shared rule table: globex's rules (and its default, whose key
    sorted first) routed acme's requests."""
    table.set_owner("other", "globex")
    assert table.set_alias("other", "live", 1, ref("other", 2))
    table.set_rules([rule("customer", "alice", "other", tenant="globex"),
                     rule("default", "default", "other", tenant="globex"),
                     rule("customer", "alice", "bot", "canary")])
    assert name_of(table.resolve(None, {"X-Customer-Id": "alice"}, TENANT)) == "bot@4"
    assert name_of(table.resolve(None, {"X-Customer-Id": "alice"}, "globex")) == "other@2"
    assert name_of(table.resolve(None, {}, TENANT)) == BASE
    assert name_of(table.resolve(None, {"X-Customer-Id": "bob"}, "globex")) == "other@2"
    # A rule of one tenant naming another tenant's adapter is never followed.
    table.set_rules([rule("default", "default", "other")])
    with pytest.raises(NotServable):
        table.resolve(None, {}, TENANT)


def test_an_adapter_with_every_alias_removed_is_not_served(table: RouteTable) -> None:
    """``serves`` (asked per request, one adapter's aliases) agrees with ``adapters``
    (every adapter's), removals and other tenants included."""
    table.set_owner("other", "globex")
    table.set_alias("other", "live", 1, ref("other", 2))
    table.set_alias("sum", "live", 2, None)
    for tenant in (TENANT, "globex", None):
        assert {a for a in ("bot", "sum", "other", "nobody")
                if table.serves(a, tenant)} == table.adapters(tenant)
    for model in ("sum", "sum@1", "sum@live"):
        with pytest.raises(NotServable) as refused:
            table.resolve(model, {}, TENANT)
        assert refused.value.message == "the adapter 'sum' is not served here"


def test_a_rule_never_reaches_another_tenants_adapter(table: RouteTable) -> None:
    table.set_owner("evil-bot", "evil")
    assert table.set_alias("evil-bot", "live", 1, ref("evil-bot", 1))
    # A rule kept under acme's key that names evil's adapter and claims to be evil's
    # (a forged delta): refused when it arrives, and refused when resolved.
    forged = rule("customer", "c1", "evil-bot", tenant="evil")
    table.set_rule(TENANT, "customer", "c1", forged)
    assert table.rules() == []
    assert name_of(table.resolve(None, {"X-Customer-Id": "c1"}, TENANT)) == BASE
    table.set_rules([rule("default", "default", "evil-bot")])  # acme's rule, evil's adapter
    with pytest.raises(NotServable):
        table.resolve(None, {}, TENANT)
    with pytest.raises(NotServable):
        table.resolve(None, {"X-Customer-Id": "c1"}, TENANT)
    assert name_of(table.resolve("evil-bot", {}, "evil")) == "evil-bot@1"
    # A delta filed under another kind or key than its rule's is dropped too.
    table.set_rule(TENANT, "task", "t", rule("customer", "c1", "bot"))
    assert table.rules() == [rule("default", "default", "evil-bot")]


def _canary(weight: int, version: int = 4, canary_id: int = 7) -> CanaryRoute:
    return CanaryRoute(id=canary_id, weight=weight, target=ref("bot", version))


def _customers(table: RouteTable, model: str = "bot", **extra: str) -> dict[str, str]:
    return {c: name_of(table.resolve(model, {CUSTOMER_HEADER: c, **extra}, TENANT))
            for c in (f"cust-{i}" for i in range(400))}


def test_an_alias_under_canary_splits_by_customer(table: RouteTable) -> None:
    table.set_canary("bot", "live", _canary(25))
    assert table.canary("bot", "live") == _canary(25)
    first = _customers(table)
    assert set(first.values()) == {"bot@3", "bot@4"}
    assert 60 <= sum(v == "bot@4" for v in first.values()) <= 140  # 25 % of 400, +-4.6 sd
    assert _customers(table) == first  # sticky
    assert first == {c: ("bot@4" if takes_canary(c, 7, 25) else "bot@3") for c in first}
    # A growing weight only moves customers to the canary.
    table.set_canary("bot", "live", _canary(50))
    second = _customers(table)
    assert all(second[c] == "bot@4" for c, v in first.items() if v == "bot@4")
    # The OpenAI `user` stands in for a missing customer; the customer wins over it.
    users = {u: name_of(table.resolve("bot", {}, TENANT, user=u)) for u in first}
    assert users == second
    # Other aliases and explicit versions are not split.
    assert set(_customers(table, "bot@canary").values()) == {"bot@4"}
    assert set(_customers(table, "bot@3").values()) == {"bot@3"}
    assert name_of(table.resolve("bot@4", {}, TENANT)) == "bot@4"


def test_a_canary_that_could_not_load_gives_its_share_to_stable(table: RouteTable) -> None:
    table.set_alias("bot", "canary", 2, None)  # bot@4 is only the canary's now
    table.set_canary("bot", "live", _canary(90), servable=False)
    assert set(_customers(table).values()) == {"bot@3"}
    assert table.is_routed("bot@4")  # kept on disk and in vLLM: it may load next time
    table.set_canary("bot", "live", _canary(90), servable=True)
    assert "bot@4" in set(_customers(table).values())
    table.set_canary("bot", "live", None)
    assert set(_customers(table).values()) == {"bot@3"} and not table.is_routed("bot@4")
    table.set_canary("bot", "live", _canary(0))  # weight 0: no canary at all
    assert table.canary("bot", "live") is None and not table.is_routed("bot@4")


def test_rules_to_an_alias_under_canary_split_alike(table: RouteTable) -> None:
    table.set_rules([rule("default", "default", "bot")])
    table.set_canary("bot", "live", _canary(25))
    by_rule = {c: name_of(table.resolve(None, {CUSTOMER_HEADER: c}, TENANT))
               for c in _customers(table)}
    assert by_rule == _customers(table)


def test_dropping_the_adapter_drops_its_canary(table: RouteTable) -> None:
    table.set_canary("bot", "live", _canary(25, version=9))
    assert table.is_routed("bot@9")
    assert name_of(table.resolve("bot@9", {}, TENANT)) == "bot@9"
    table.drop_adapter("bot")
    assert table.canary("bot", "live") is None and not table.is_routed("bot@9")


def _side(result: Target | UnresolvedVersion) -> tuple[int, str] | None:
    assert isinstance(result, Target)
    return result.canary


class _Unread(Mapping[str, str]):
    """Headers that fail the test if read."""

    def __getitem__(self, key: str) -> str:
        raise AssertionError(f"header {key} read")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("headers listed")

    def __len__(self) -> int:
        raise AssertionError("headers counted")


def test_a_request_under_canary_carries_its_side(table: RouteTable) -> None:
    # No canary: no side, and no header read to find that out.
    assert _side(table.resolve("bot", _Unread(), TENANT)) is None
    table.set_canary("bot", "live", _canary(25))
    sides = {c: table.resolve("bot", {CUSTOMER_HEADER: c}, TENANT) for c in _customers(table)}
    for customer, target in sides.items():
        to_canary = takes_canary(customer, 7, 25)
        assert target.model_name == ("bot@4" if to_canary else "bot@3")
        assert _side(target) == (7, "canary" if to_canary else "stable")
    # A rule to the alias splits alike; the OpenAI `user` too.
    table.set_rules([rule("default", "default", "bot")])
    first = next(iter(sides))
    assert _side(table.resolve(None, {CUSTOMER_HEADER: first}, TENANT)) == _side(sides[first])
    assert _side(table.resolve("bot", {}, TENANT, user=first)) == _side(sides[first])
    # Explicit versions, other aliases and the base model are not under the canary.
    assert _side(table.resolve("bot@4", {CUSTOMER_HEADER: first}, TENANT)) is None
    assert _side(table.resolve("bot@3", {CUSTOMER_HEADER: first}, TENANT)) is None
    assert _side(table.resolve("bot@canary", {CUSTOMER_HEADER: first}, TENANT)) is None
    assert _side(table.resolve("sum", {CUSTOMER_HEADER: first}, TENANT)) is None
    assert _side(table.resolve(BASE, {}, TENANT)) is None
    assert table.canary_ids() == {7}


def test_an_unservable_canary_sends_every_request_to_stable_as_stable(
        table: RouteTable) -> None:
    table.set_alias("bot", "canary", 2, None)
    table.set_canary("bot", "live", _canary(100), servable=False)
    targets = [table.resolve("bot", {CUSTOMER_HEADER: c}, TENANT) for c in _customers(table)]
    assert {(t.model_name, _side(t)) for t in targets} == {("bot@3", (7, "stable"))}
    # The canary still runs here: its id is reported (its load failure with it).
    assert table.canary_ids() == {7}
    # By version, the canary's version is found but counts for no side.
    assert _side(table.resolve("bot@4", {}, TENANT)) is None
    table.set_canary("bot", "live", None)
    assert table.canary_ids() == set()
    assert _side(table.resolve("bot", {CUSTOMER_HEADER: "c1"}, TENANT)) is None
