"""Content-addressed blob stores: a local directory (embedded default) and S3."""

from registry_service.blobs.base import (
    DEFAULT_CHUNK_SIZE,
    BlobStore,
    BlobStream,
    blob_key,
    content_disposition,
    validate_sha256,
)
from registry_service.blobs.factory import build_blob_store
from registry_service.blobs.local import LocalBlobStore
from registry_service.blobs.s3 import S3BlobStore

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "BlobStore",
    "BlobStream",
    "LocalBlobStore",
    "S3BlobStore",
    "blob_key",
    "build_blob_store",
    "content_disposition",
    "validate_sha256",
]
