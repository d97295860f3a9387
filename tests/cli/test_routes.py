"""``loraplane route`` and ``loraplane alias delete`` against a real registry.

The tests share one registry (``served``); each uses its own adapters and route keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devharness.adapters import make_adapter
from tests.cli.conftest import ServedRegistry

pytestmark = pytest.mark.e2e


def routable(served: ServedRegistry, name: str, tenant: str, folder: Path) -> None:
    """Adapter ``name`` of ``tenant`` whose ``live`` alias points at version 1."""
    served.run("adapters", "create", name, "--base-model", "tiny-llama", "--tenant", tenant)
    served.run("push", name, str(make_adapter(folder, seed=len(name))), "--alias", "live")


def rules(served: ServedRegistry, *args: str,
          token: tuple[str, ...] = ()) -> list[tuple[str, str, str, str]]:
    """``loraplane [--token T] route list ARGS`` as (tenant, kind, key, target)."""
    routes = served.run(*token, "--json", "route", "list", *args).json()["routes"]
    return [(r["tenant"], r["kind"], r["key"], f"{r['adapter']}@{r['alias']}") for r in routes]


def publisher(served: ServedRegistry, tenant: str) -> str:
    return served.run("token", "create", f"pub-{tenant}", "--role", "publisher",
                      "--tenant", tenant).stdout.strip()


def test_set_list_and_delete_a_rule_of_each_kind(served: ServedRegistry, tmp_path: Path) -> None:
    routable(served, "kinds-bot", "kinds", tmp_path / "a")
    served.run("promote", "kinds-bot", "1", "--alias", "canary")
    set_customer = served.run("route", "set", "customer", "alice", "--adapter", "kinds-bot",
                              "--alias", "canary")
    assert set_customer.stdout.strip() == (
        "set customer/alice -> kinds-bot@canary (tenant kinds, base model tiny-llama)")
    task = served.run("--json", "route", "set", "task", "summarize", "--adapter",
                      "kinds-bot").json()
    assert (task["kind"], task["key"], task["alias"], task["tenant"]) == (
        "task", "summarize", "live", "kinds")
    # The default rule's one key may be left out, or given.
    served.run("route", "set", "default", "--adapter", "kinds-bot")
    served.run("route", "set", "default", "default", "--adapter", "kinds-bot")
    mine = ("--tenant", "kinds")
    assert rules(served, *mine) == [("kinds", "customer", "alice", "kinds-bot@canary"),
                                    ("kinds", "default", "default", "kinds-bot@live"),
                                    ("kinds", "task", "summarize", "kinds-bot@live")]
    assert rules(served, "--kind", "task", *mine) == [
        ("kinds", "task", "summarize", "kinds-bot@live")]
    table = served.run("route", "list", *mine).stdout
    assert "customer" in table and "kinds-bot@canary" in table

    assert served.run("route", "delete", "customer", "alice").stdout.strip() == \
        "deleted customer/alice"
    served.run("route", "delete", "task", "summarize", *mine)
    served.run("route", "delete", "default")
    assert rules(served, *mine) == []
    assert "no routing rules" in served.run("route", "list", *mine).stdout


def test_a_global_admin_names_the_tenant(served: ServedRegistry, tmp_path: Path) -> None:
    routable(served, "north-bot", "north", tmp_path / "n")
    routable(served, "south-bot", "south", tmp_path / "s")
    served.run("route", "set", "customer", "bob", "--adapter", "north-bot")
    served.run("route", "set", "customer", "bob", "--adapter", "south-bot", "--tenant", "south")
    assert rules(served, "--tenant", "south") == [
        ("south", "customer", "bob", "south-bot@live")]

    ambiguous = served.run("route", "delete", "customer", "bob", expect=1)
    assert "several tenants have a rule customer/bob" in ambiguous.stderr
    assert "[tenant_required]" in ambiguous.stderr
    served.run("route", "delete", "customer", "bob", "--tenant", "north")
    assert rules(served, "--tenant", "north") == []
    # Now only one tenant holds the key: no need to name it.
    served.run("route", "delete", "customer", "bob")
    assert rules(served, "--tenant", "south") == []

    elsewhere = served.run("route", "set", "customer", "bob", "--adapter", "north-bot",
                           "--tenant", "south", expect=1)
    assert "[adapter_not_found]" in elsewhere.stderr
    unknown = served.run("--json", "route", "set", "customer", "bob", "--adapter", "north-bot",
                         "--tenant", "nowhere", expect=1).json()
    assert (unknown["error"]["status"], unknown["error"]["code"]) == (404, "tenant_not_found")
    assert rules(served, "--tenant", "nowhere") == []


def test_a_publisher_manages_only_its_own_tenant(served: ServedRegistry,
                                                 tmp_path: Path) -> None:
    routable(served, "east-bot", "east", tmp_path / "e")
    routable(served, "west-bot", "west", tmp_path / "w")
    served.run("route", "set", "task", "translate", "--adapter", "west-bot")
    as_east = ("--token", publisher(served, "east"))

    served.run(*as_east, "route", "set", "task", "translate", "--adapter", "east-bot")
    served.run(*as_east, "route", "set", "task", "translate", "--adapter", "east-bot",
               "--tenant", "east")
    assert rules(served, token=as_east) == [("east", "task", "translate", "east-bot@live")]
    forbidden = served.run(*as_east, "route", "list", "--tenant", "west", expect=1)
    assert "may not manage another tenant's routes" in forbidden.stderr
    assert "[tenant_forbidden]" in forbidden.stderr
    hidden = served.run(*as_east, "route", "set", "task", "t2", "--adapter", "west-bot",
                        expect=1)
    assert "[adapter_not_found]" in hidden.stderr
    assert "[tenant_forbidden]" in served.run(
        *as_east, "route", "delete", "task", "translate", "--tenant", "west", expect=1).stderr

    # Its delete means its own rule, though west holds the same key.
    served.run(*as_east, "route", "delete", "task", "translate")
    assert rules(served, token=as_east) == []
    assert rules(served, "--tenant", "west") == [("west", "task", "translate", "west-bot@live")]


def test_alias_delete(served: ServedRegistry, tmp_path: Path) -> None:
    routable(served, "alias-bot", "aliases", tmp_path / "a")
    served.run("promote", "alias-bot", "1", "--alias", "canary")
    deleted = served.run("alias", "delete", "alias-bot", "canary")
    assert deleted.stdout.strip() == "alias-bot canary: 1 -> removed (revision 2)"
    shown = served.run("--json", "adapters", "show", "alias-bot").json()
    assert [(a["alias"], a["version"]) for a in shown["aliases"]
            if a["version"] is not None] == [("live", 1)]
    assert "delete" in served.run("history", "alias-bot", "--alias", "canary").stdout
    again = served.run("alias", "delete", "alias-bot", "canary", expect=1)
    assert "error: alias 'canary' of 'alias-bot' not found" in again.stderr
    assert "[alias_not_found]" in again.stderr


def test_bad_input_is_a_message_and_a_non_zero_exit(served: ServedRegistry,
                                                     tmp_path: Path) -> None:
    routable(served, "bad-bot", "bad", tmp_path / "b")
    no_key = served.run("route", "set", "customer", "--adapter", "bad-bot", expect=2)
    assert "a customer rule needs a KEY" in no_key.stderr
    other_default = served.run("route", "set", "default", "main", "--adapter", "bad-bot",
                               expect=1)
    assert "a tenant has one default rule, whose key is 'default'" in other_default.stderr
    assert "[invalid_route_key]" in other_default.stderr
    assert "[alias_not_found]" in served.run("route", "set", "customer", "carol", "--adapter",
                                             "bad-bot", "--alias", "nope", expect=1).stderr
    assert "[route_not_found]" in served.run("route", "delete", "customer", "nobody",
                                             expect=1).stderr
    assert "'region' is not one of" in served.run("route", "set", "region", "eu", "--adapter",
                                                  "bad-bot", expect=2).stderr
    assert "Missing option '--adapter'" in served.run("route", "set", "task", "x",
                                                      expect=2).stderr
    assert rules(served, "--tenant", "bad") == []
