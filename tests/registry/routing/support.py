"""Adapters that routing rules may name: their aliases point at a version."""

from __future__ import annotations

from sqlalchemy import select

from devharness.registry import RegistryHarness
from registry_service.adapters.models import Adapter
from registry_service.aliases.models import Alias
from registry_service.versions.models import Version

OWN = "acme"

ALIASES = ("live", "canary", *(f"a{i}" for i in range(6)))


async def routable(registry: RegistryHarness, name: str, *, tenant: str = OWN,
                   base_model: str = "tiny-llama", aliases: tuple[str, ...] = ALIASES) -> None:
    """An adapter whose aliases (ALIASES) point at a version, so rules may name them."""
    await registry.create_adapter(name, tenant=tenant, base_model=base_model)
    async with registry.ctx.db.session() as session:
        adapter = await session.scalar(select(Adapter).where(Adapter.name == name))
        assert adapter is not None
        version = Version(adapter_id=adapter.id, number=1, digest="d" * 64, files=[],
                          total_size=0, rank=8, alpha=16.0, target_modules=["q_proj"],
                          uploader="tests")
        session.add(version)
        await session.flush()
        session.add_all(Alias(adapter_id=adapter.id, name=alias, version_id=version.id,
                              revision=1) for alias in aliases)
        await session.commit()
