"""``GET /v1/adapters`` lists each adapter's aliases, as ``GET /v1/adapters/NAME`` does,
read for the whole page in one query."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir


@contextmanager
def alias_queries(registry: RegistryHarness) -> Iterator[list[str]]:
    """The SQL statements reading the aliases table while the block runs."""
    seen: list[str] = []

    def record(*args: Any) -> None:
        statement = str(args[2])
        if "FROM aliases" in statement:
            seen.append(statement)

    engine = registry.ctx.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


async def test_the_list_fills_aliases_in_one_query(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    for index, name in enumerate(("a-bot", "b-bot", "c-bot")):
        await registry.create_adapter(name)
        folder = make_adapter(tmp_path / name, seed=index)
        assert (await upload_dir(registry, name, folder, aliases="live,canary")
                ).status_code == 201
    removed = await registry.client.delete("/v1/adapters/b-bot/aliases/canary",
                                           headers=registry.admin_headers)
    assert removed.status_code == 200, removed.text
    with alias_queries(registry) as seen:
        listed = await registry.client.get("/v1/adapters", headers=registry.admin_headers)
    assert listed.status_code == 200, listed.text
    aliases = {a["name"]: [(x["alias"], x["version"]) for x in a["aliases"]]
               for a in listed.json()["adapters"]}
    assert aliases == {"a-bot": [("canary", 1), ("live", 1)], "b-bot": [("live", 1)],
                       "c-bot": [("canary", 1), ("live", 1)]}
    shown = await registry.client.get("/v1/adapters/b-bot", headers=registry.admin_headers)
    assert shown.json()["aliases"] == next(
        a for a in listed.json()["adapters"] if a["name"] == "b-bot")["aliases"]
    assert len(seen) == 1, seen
