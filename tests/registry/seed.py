"""A registry seeded straight into its tables: adapters of two tenants with versions,
aliases and routing rules, and outbox rows, for the desired-state and event tests."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import AdapterDeleted, DesiredAdapter, DesiredAlias, FileRef, VersionRef
from registry_service.adapters.models import Adapter
from registry_service.aliases.models import Alias
from registry_service.auth.roles import Principal, Role
from registry_service.db.base import utcnow
from registry_service.db.engine import Database
from registry_service.events.models import EventRow
from registry_service.events.service import envelope, record_event
from registry_service.routing.models import RouteRuleRow
from registry_service.tenants.service import get_or_create_tenant
from registry_service.versions.models import Version


@dataclass
class Seeded:
    adapter: Adapter
    versions: list[Version]


async def seed_adapter(
    session: AsyncSession, *, tenant: str, name: str, base_model: str, versions: int = 0,
    aliases: dict[str, int | None] | None = None, deleted: bool = False,
) -> Seeded:
    """An adapter with ``versions`` versions and aliases (alias -> version number, or None
    for a removed alias), written straight into the tables."""
    owner = await get_or_create_tenant(session, tenant)
    adapter = Adapter(name=name, tenant_id=owner.id, tenant=owner, base_model=base_model,
                      last_version=versions, deleted_at=utcnow() if deleted else None)
    session.add(adapter)
    await session.flush()
    rows = [_version(adapter, number) for number in range(1, versions + 1)]
    session.add_all(rows)
    await session.flush()
    for alias, number in (aliases or {}).items():
        target = rows[number - 1].id if number is not None else None
        session.add(Alias(adapter_id=adapter.id, name=alias, version_id=target, revision=3))
    await session.flush()
    return Seeded(adapter=adapter, versions=rows)


def _rule(seeded: Seeded, *, kind: str, key: str, alias: str) -> RouteRuleRow:
    adapter = seeded.adapter
    return RouteRuleRow(tenant_id=adapter.tenant_id, kind=kind, key=key,
                        adapter_id=adapter.id, alias=alias)


def _version(adapter: Adapter, number: int) -> Version:
    files = [{"name": "adapter_config.json", "size": 120 + number, "sha256": "a" * 64},
             {"name": "adapter_model.safetensors", "size": 4096 * number, "sha256": "b" * 64}]
    return Version(adapter_id=adapter.id, number=number, digest=f"{number:064x}",
                   files=files, total_size=sum(f["size"] for f in files), rank=8 * number,
                   alpha=16.0, target_modules=["q_proj", "v_proj"], uploader="tests")


def expected_ref(seeded: Seeded, number: int) -> VersionRef:
    adapter, version = seeded.adapter, seeded.versions[number - 1]
    base = f"/v1/adapters/{adapter.name}/versions/{number}/files"
    return VersionRef(
        adapter=adapter.name, version=number, digest=version.digest,
        base_model=adapter.base_model, rank=version.rank, alpha=16.0,
        target_modules=["q_proj", "v_proj"],
        files=[FileRef(name=f["name"], size=f["size"], sha256=f["sha256"],
                       url=f"{base}/{f['name']}") for f in version.files],
    )


BASE = "tiny-llama"
AGENT = Principal(token_id=1, name="agent", role=Role.AGENT, tenant_id=None, tenant=None)
ADMIN = Principal(token_id=2, name="admin", role=Role.ADMIN, tenant_id=None, tenant=None)


@dataclass
class Catalog:
    bot: Seeded
    fresh: Seeded
    beta: Seeded
    acme_reader: Principal


async def seed_catalog(db: Database) -> Catalog:
    async with db.session() as session:
        bot = await seed_adapter(session, tenant="acme", name="support-bot", base_model=BASE,
                                 versions=2, aliases={"live": 2, "canary": 1, "old": None})
        fresh = await seed_adapter(session, tenant="acme", name="fresh", base_model=BASE)
        beta = await seed_adapter(session, tenant="beta", name="beta-bot", base_model=BASE,
                                  versions=1, aliases={"live": 1})
        other = await seed_adapter(session, tenant="acme", name="other-base",
                                   base_model="other-model", versions=1, aliases={"live": 1})
        gone = await seed_adapter(session, tenant="acme", name="gone", base_model=BASE,
                                  versions=1, aliases={"live": 1}, deleted=True)
        session.add_all([
            _rule(bot, kind="customer", key="c-1", alias="live"),
            _rule(beta, kind="task", key="summarize", alias="canary"),
            _rule(gone, kind="default", key="default", alias="live"),
            _rule(other, kind="customer", key="c-2", alias="live"),
        ])
        await session.commit()
        reader = Principal(token_id=3, name="acme-reader", role=Role.READER,
                           tenant_id=bot.adapter.tenant_id, tenant="acme")
    return Catalog(bot=bot, fresh=fresh, beta=beta, acme_reader=reader)


async def publish_two_of_three(db: Database) -> list[EventRow]:
    """Three events; the relay has published the first two (stream seqs 7 and 9)."""
    async with db.session() as session:
        rows = [record_event(session, AdapterDeleted(**envelope(tenant, "x"), base_model=BASE),
                             actor="tests")
                for tenant in ("acme", "beta", "acme")]
        await session.flush()
        for row, stream_seq in zip(rows[:2], (7, 9), strict=False):
            await session.execute(update(EventRow).where(EventRow.seq == row.seq)
                                  .values(published_at=utcnow(), stream_seq=stream_seq))
        await session.commit()
    return rows


def bot_desired(catalog: Catalog) -> DesiredAdapter:
    return DesiredAdapter(tenant="acme", name="support-bot", base_model=BASE, aliases=[
        DesiredAlias(alias="canary", revision=3, target=expected_ref(catalog.bot, 1)),
        DesiredAlias(alias="live", revision=3, target=expected_ref(catalog.bot, 2)),
    ])
