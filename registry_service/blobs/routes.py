"""``POST /v1/admin/blob-gc``: a pass of the blob collector on demand."""

from __future__ import annotations

from fastapi import APIRouter

from registry_service.blobs.gc import GcReport, run_blob_gc
from registry_service.deps import CtxDep, PrincipalDep

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post("/blob-gc", summary="Collect unreferenced blobs")
async def post_blob_gc(ctx: CtxDep, principal: PrincipalDep) -> GcReport:
    """Collect unreferenced blobs now (also done at start-up and periodically)."""
    return await run_blob_gc(principal, ctx.db, ctx.blobs, ctx.settings, ctx.metrics)
