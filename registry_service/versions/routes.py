"""``/v1/adapters/{name}/versions``: upload, list and show versions, and download their
files. An upload's body streams in (``UploadBody``), never parsed by FastAPI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse

from loraplane.api.bounds import INT32_MAX
from registry_service.blobs.base import BlobStream, content_disposition
from registry_service.deps import CtxDep, PrincipalDep, ReaderDep, SessionDep
from registry_service.versions import service
from registry_service.versions.history import history_page
from registry_service.versions.schemas import UploadResult, VersionOut, VersionPage
from registry_service.versions.upload import ARCHIVE_SUFFIXES, UploadBody

router = APIRouter(prefix="/v1/adapters/{name}/versions", tags=["versions"])

VersionPath = Annotated[int, Path(ge=1, le=INT32_MAX)]

# The body is streamed by ``UploadBody``, never parsed by FastAPI; this only describes it.
_UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": {
        "type": "object",
        "required": ["files"],
        "properties": {
            "files": {
                "type": "array", "items": {"type": "string", "format": "binary"},
                "description": "adapter_config.json and adapter_model.safetensors, or one "
                               f"archive of them ({', '.join(ARCHIVE_SUFFIXES)}); each "
                               "part's file name says which",
            },
            "aliases": {"type": "string",
                        "description": "comma-separated aliases to move to the new version; "
                                       "absent or empty: none (storing a version does "
                                       "not serve it)"},
            "notes": {"type": "string", "description": "free text kept with the version"},
            "allow_shape_change": {
                "type": "boolean", "default": False,
                "description": "accept tensor shapes unlike the adapter's current versions' "
                               "(else 422 shape_mismatch); the answer's "
                               "shape_change_allowed says it was needed"},
            "abort_canary": {
                "type": "boolean", "default": False,
                "description": "abort a canary running on an alias this upload moves "
                               "(else 409 canary_running)"},
        },
    },
    "encoding": {"files": {"contentType": "application/octet-stream"}},
}}}}


@router.post("", summary="Upload a version", status_code=201, response_model=UploadResult,
             responses={200: {"model": UploadResult, "description": "identical re-upload"}},
             openapi_extra=_UPLOAD_BODY)
async def upload_version(name: str, request: Request, session: SessionDep,
                         principal: PrincipalDep, ctx: CtxDep) -> JSONResponse:
    """Stream a PEFT LoRA folder's two files, or one archive of them, as the adapter's next
    version (publisher), validated while it streams; nothing is stored unless every check
    passes. Identical files answer 200 with the existing version, new ones 201. Aliases named in
    `aliases` move to it in the same commit."""
    body = UploadBody(content_type=request.headers.get("content-type"),
                      content_length=request.headers.get("content-length"),
                      chunks=request.stream())
    result = await service.publish_version(session, principal, name, blobs=ctx.blobs,
                                           settings=ctx.settings, body=body,
                                           slots=ctx.upload_slots, metrics=ctx.metrics)
    return JSONResponse(result.model_dump(mode="json"), status_code=201 if result.created else 200)


@router.get("", summary="List versions", response_model=VersionPage)
async def list_versions(name: str, session: SessionDep, principal: ReaderDep,
                        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
                        cursor: str | None = None) -> Response:
    """The adapter's versions, newest first, `limit` at a time; pass `next_cursor` as `cursor`
    for older ones."""
    page = await history_page(session, principal, name, limit=limit, cursor=cursor)
    return Response(page, media_type="application/json")


@router.get("/{version}", summary="Show a version")
async def get_version(name: str, version: VersionPath, session: SessionDep,
                      principal: PrincipalDep) -> VersionOut:
    """One version: its files with their sizes and sha256, the digest over them, rank, alpha,
    target modules, uploader and notes."""
    return await service.show_version(session, principal, name, version)


# The file's bytes, or a redirect to the blob store: never the JSON FastAPI assumes.
_FILE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the file's bytes",
          "content": {"application/octet-stream": {"schema": {"type": "string",
                                                              "format": "binary"}}}},
    307: {"description": "a presigned URL of the blob store, when it serves downloads"},
}


@router.get("/{version}/files/{filename}", summary="Download a file of a version",
            response_model=None, responses=_FILE_RESPONSES)
async def get_file(name: str, version: VersionPath, filename: str, session: SessionDep,
                   principal: PrincipalDep, ctx: CtxDep) -> Response:
    """The file's bytes (checked against its sha256 by `loraplane.client`), or a 307 to a
    short-lived presigned URL of the blob store when it serves downloads."""
    found = await service.open_file(session, principal, name, version, filename,
                                    blobs=ctx.blobs, settings=ctx.settings)
    if found.redirect_url is not None:
        return RedirectResponse(found.redirect_url, status_code=307)
    assert found.stream is not None
    headers = {"Content-Length": str(found.size), "ETag": f'"{found.sha256}"',
               "Content-Disposition": content_disposition(found.filename),
               "X-Content-SHA256": found.sha256}
    return StreamingResponse(_closing(found.stream), media_type="application/octet-stream",
                             headers=headers)


async def _closing(stream: BlobStream) -> AsyncIterator[bytes]:
    # Starlette does not close a plain iterator when the client goes away; a generator's
    # ``finally`` does, and releases the S3 connection or the file handle.
    async with stream:
        async for chunk in stream:
            yield chunk
