"""Builds the configured blob store; settings are wired to it by the application."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from registry_service.blobs.base import BlobStore
from registry_service.blobs.local import LocalBlobStore
from registry_service.blobs.s3 import S3BlobStore


def build_blob_store(kind: Literal["local", "s3"], **params: Any) -> BlobStore:
    """``local`` takes ``root``; ``s3`` takes the keyword arguments of ``S3BlobStore``."""
    if kind == "local":
        unknown = set(params) - {"root"}
        if unknown or "root" not in params:
            raise TypeError(f"local blob store takes exactly 'root', got {sorted(params)}")
        return LocalBlobStore(Path(params["root"]))
    if kind == "s3":
        return S3BlobStore(**params)
    raise ValueError(f"unknown blob store kind {kind!r}; expected 'local' or 's3'")
