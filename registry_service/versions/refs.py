"""The ``VersionRef`` an agent needs, built from rows (used by events and /v1/desired)."""

from __future__ import annotations

from loraplane.events import FileRef, VersionRef
from registry_service.adapters.models import Adapter
from registry_service.versions.models import Version


def file_url(adapter: str, version: int, filename: str) -> str:
    return f"/v1/adapters/{adapter}/versions/{version}/files/{filename}"


def version_ref(adapter: Adapter, version: Version) -> VersionRef:
    return VersionRef(
        adapter=adapter.name,
        version=version.number,
        digest=version.digest,
        base_model=adapter.base_model,
        rank=version.rank,
        alpha=version.alpha,
        target_modules=list(version.target_modules),
        files=[
            FileRef(name=f["name"], size=f["size"], sha256=f["sha256"],
                    url=file_url(adapter.name, version.number, f["name"]))
            for f in version.files
        ],
    )
