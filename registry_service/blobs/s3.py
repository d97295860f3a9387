"""Blob store on S3 (AWS, MinIO, SeaweedFS, ...) through boto3.

boto3 is synchronous, so every call runs in a worker thread. Its errors never leave
this module: they become ``BlobNotFound`` or ``BlobStoreUnavailable``. Timeouts and
retries are short on purpose: a dead S3 must turn into a 503 within seconds, not
hang requests for minutes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import boto3
import urllib3.exceptions
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from registry_service.blobs.base import (
    DEFAULT_CHUNK_SIZE,
    BlobStream,
    StoredBlob,
    blob_key,
    content_disposition,
    sha256_of_key,
)
from registry_service.blobs.lean_models import lean_botocore_session
from registry_service.blobs.s3_writer import UPLOADS_PREFIX, S3BlobWriter
from registry_service.errors import (
    BlobNotFound,
    BlobStoreFull,
    BlobStoreUnavailable,
    RegistryError,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

P = ParamSpec("P")
T = TypeVar("T")

_MIB = 1024 * 1024
MAX_PRESIGN_EXPIRY_S = 7 * 24 * 3600  # the SigV4 ceiling
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "RequestLimitExceeded",
        "RequestTimeout",
        "ServiceUnavailable",
        "InternalError",
    }
)
_TRANSPORT_ERRORS = (BotoCoreError, urllib3.exceptions.HTTPError, OSError)
# A store out of space: MinIO's 507 (its drives below their free-space threshold) and
# Ceph RGW's bucket or user quota (403). S3 itself never fills; EntityTooLarge is one
# object over S3's size limit, not a full store, and stays what it was.
_FULL_CODES = frozenset({"XMinioStorageFull", "QuotaExceeded"})


def _client_error_info(exc: ClientError) -> tuple[str, int]:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    return code, status


def map_s3_error(
    exc: Exception, *, op: str, sha256: str | None, key_level: bool = True
) -> Exception:
    """Translate a boto3/botocore/urllib3 error; anything else is returned unchanged.

    ``key_level`` says whether a 404 means "no such blob" (object calls) or a missing
    bucket (bucket calls, which is a misconfiguration, not a missing blob).
    """
    if isinstance(exc, S3UploadFailedError) and isinstance(exc.__context__, Exception):
        # boto3 wraps the real ClientError of a failed transfer in a string-only error.
        return map_s3_error(exc.__context__, op=op, sha256=sha256, key_level=key_level)
    detail: dict[str, Any] = {"op": op}
    if sha256 is not None:
        detail["sha256"] = sha256
    if isinstance(exc, ClientError):
        code, status = _client_error_info(exc)
        detail.update(s3_code=code, s3_status=status)
        if key_level and (code in _NOT_FOUND_CODES or (status == 404 and code != "NoSuchBucket")):
            return BlobNotFound("blob not found", detail=detail)
        if status == 507 or code in _FULL_CODES:
            return BlobStoreFull(f"the S3 store is full (refused to {op}: {code or status})",
                                 detail=detail)
        error = BlobStoreUnavailable(f"S3 refused to {op}: {code or status}", detail=detail)
        error.retryable = status >= 500 or status == 429 or code in _TRANSIENT_CODES
        return error
    if isinstance(exc, _TRANSPORT_ERRORS):
        detail["error"] = type(exc).__name__
        return BlobStoreUnavailable(f"S3 unreachable while trying to {op}: {exc}", detail=detail)
    return exc


def _client_config(
    region: str,
    path_style: bool,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_attempts: int,
    *,
    pool: int,
    sign_payload: bool = True,
) -> Config:
    return Config(
        signature_version="s3v4",
        region_name=region,
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        s3={"addressing_style": "path" if path_style else "auto",
            "payload_signing_enabled": sign_payload},
        max_pool_connections=pool,
        tcp_keepalive=True,
        # Default CRC trailers of recent boto3 break several S3-compatible servers.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


def signs_payload(endpoint_url: str | None, mode: str = "auto") -> bool:
    """Whether uploads sign their body's sha256 (SigV4 payload signing). ``auto``: over
    plain HTTP only, where it is what keeps a body changed on the way from being stored.
    Over TLS botocore would still hash every part for it, a second sha256 of each
    uploaded byte (the registry hashes the stream itself); TLS protects the body in
    transit, and a blob is named by its sha256, which every reader checks. ``None`` is
    AWS: HTTPS. ``on``/``off`` decide outright (``off`` over HTTP: a trusted network)."""
    if mode != "auto":
        return mode == "on"
    return endpoint_url is not None and not endpoint_url.lower().startswith("https://")


class S3BlobStore:
    """Blobs as objects ``sha256/<ab>/<cd>/<hex>`` in one bucket."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        path_style: bool = False,
        create_bucket: bool = False,
        presign_endpoint_url: str | None = None,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 5.0,
        max_attempts: int = 2,
        upload_read_timeout_s: float = 60.0,
        upload_max_attempts: int = 3,
        part_size_mb: int = 16,
        upload_concurrency: int = 4,
        stream_part_mb: int = 5,
        stream_parts_in_flight: int = 2,
        payload_signing: str = "auto",
    ) -> None:
        self.bucket = bucket
        self.region = region
        self._create_bucket = create_bucket
        self._bucket_ready = False
        self._bucket_lock = asyncio.Lock()
        session = boto3.session.Session(
            aws_access_key_id=access_key, aws_secret_access_key=secret_key, region_name=region,
            botocore_session=lean_botocore_session(),
        )
        # Every call but the upload itself fails fast: against a hung S3 (connections
        # accepted, no answer) the defaults give up after about 10 s, a refused
        # connection at once.
        config = _client_config(
            region, path_style, connect_timeout_s, read_timeout_s, max_attempts, pool=10
        )
        self._client: S3Client = session.client("s3", endpoint_url=endpoint_url, config=config)
        # Completing a large multipart upload can legitimately keep S3 quiet for a while.
        upload_config = _client_config(
            region,
            path_style,
            connect_timeout_s,
            upload_read_timeout_s,
            upload_max_attempts,
            pool=max(10, upload_concurrency * 2),
            sign_payload=signs_payload(endpoint_url, payload_signing),
        )
        self._upload_client: S3Client = session.client(
            "s3", endpoint_url=endpoint_url, config=upload_config
        )
        # Clients outside may reach S3 under another name than the registry does.
        self._presign_client: S3Client = (
            session.client("s3", endpoint_url=presign_endpoint_url, config=config)
            if presign_endpoint_url
            else self._client
        )
        self._stream_part = stream_part_mb * _MIB
        self._stream_in_flight = stream_parts_in_flight
        part = part_size_mb * _MIB
        # Bounded parts and threads keep memory flat whatever the blob size.
        self._transfer = TransferConfig(
            multipart_threshold=part,
            multipart_chunksize=part,
            max_concurrency=upload_concurrency,
            use_threads=True,
        )

    async def _run(
        self,
        op: str,
        sha256: str | None,
        fn: Callable[P, T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as exc:
            mapped = map_s3_error(exc, op=op, sha256=sha256, key_level=sha256 is not None)
            if mapped is exc:
                raise
            raise mapped from exc

    async def put_file(self, sha256: str, path: Path, size: int) -> None:
        key = blob_key(sha256)
        actual = (await asyncio.to_thread(os.stat, path)).st_size
        if actual != size:
            raise ValueError(f"{path} has {actual} bytes, expected {size}")
        await self._ensure_bucket()
        # One HEAD is far cheaper than re-sending up to gigabytes of identical content.
        if await self.size(sha256) == size:
            return
        await self._run(
            "upload a blob",
            sha256,
            self._upload_client.upload_file,
            Filename=str(path),
            Bucket=self.bucket,
            Key=key,
            ExtraArgs={"ContentType": "application/octet-stream", "Metadata": {"sha256": sha256}},
            Config=self._transfer,
        )

    async def open_writer(self, expected_sha256: str | None = None) -> S3BlobWriter:
        await self._ensure_bucket()
        # Content already stored (an identical re-upload) is only hashed and checked.
        stored = expected_sha256 is not None and await self.exists(expected_sha256)

        def map_error(exc: Exception) -> Exception:
            return map_s3_error(exc, op="upload a blob", sha256=expected_sha256)

        return S3BlobWriter(
            self._upload_client, self.bucket,
            final_key=blob_key(expected_sha256) if expected_sha256 else None,
            part_size=self._stream_part, parts_in_flight=self._stream_in_flight,
            copy_config=self._transfer, map_error=map_error, discard=stored)

    async def sweep_incomplete(self, older_than_s: float) -> int:
        await self._ensure_bucket()
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
        removed = 0
        async for upload in self._pages("list multipart uploads",
                                        self._client.list_multipart_uploads, "Uploads",
                                        ("KeyMarker", "NextKeyMarker"),
                                        ("UploadIdMarker", "NextUploadIdMarker")):
            if upload["Initiated"] < cutoff:
                await self._run("abort an upload", None, self._client.abort_multipart_upload,
                                Bucket=self.bucket, Key=upload["Key"],
                                UploadId=upload["UploadId"])
                removed += 1
        async for item in self._pages("list temporary uploads", self._client.list_objects_v2,
                                      "Contents", ("ContinuationToken", "NextContinuationToken"),
                                      prefix=UPLOADS_PREFIX):
            if item["LastModified"] < cutoff:
                await self._run("delete a temporary upload", None, self._client.delete_object,
                                Bucket=self.bucket, Key=item["Key"])
                removed += 1
        return removed

    async def _pages(self, op: str, fn: Callable[..., Any], field: str,
                     *markers: tuple[str, str], prefix: str | None = None
                     ) -> AsyncIterator[Any]:
        """Every item of a paginated listing; ``markers`` pair a request key with the
        response key that continues it."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if prefix is not None:
            kwargs["Prefix"] = prefix
        while True:
            page = await self._run(op, None, fn, **kwargs)
            for item in page.get(field, []):
                yield item
            follow = {ask: page.get(answer) for ask, answer in markers if page.get(answer)}
            if not page.get("IsTruncated") or not follow:
                return
            kwargs.update(follow)

    async def exists(self, sha256: str) -> bool:
        return await self.size(sha256) is not None

    async def size(self, sha256: str) -> int | None:
        key = blob_key(sha256)
        try:
            head = await self._run(
                "stat a blob", sha256, self._client.head_object, Bucket=self.bucket, Key=key
            )
        except BlobNotFound:
            return None
        return int(head["ContentLength"])

    async def open_stream(self, sha256: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> BlobStream:
        key = blob_key(sha256)
        response = await self._run(
            "read a blob", sha256, self._client.get_object, Bucket=self.bucket, Key=key
        )

        def map_error(exc: Exception) -> Exception:
            return map_s3_error(exc, op="read a blob", sha256=sha256)

        return BlobStream(
            response["Body"],
            sha256=sha256,
            size=int(response["ContentLength"]),
            chunk_size=chunk_size,
            map_error=map_error,
        )

    async def presigned_url(self, sha256: str, *, filename: str, expires_s: int) -> str | None:
        key = blob_key(sha256)
        if not 0 < expires_s <= MAX_PRESIGN_EXPIRY_S:
            raise ValueError(f"expires_s must be in 1..{MAX_PRESIGN_EXPIRY_S}")
        params = {
            "Bucket": self.bucket,
            "Key": key,
            "ResponseContentDisposition": content_disposition(filename),
            "ResponseContentType": "application/octet-stream",
        }
        # Signing is local, but refreshing role credentials may go over the network.
        return await self._run(
            "presign a blob URL",
            sha256,
            self._presign_client.generate_presigned_url,
            "get_object",
            Params=params,
            ExpiresIn=expires_s,
        )

    async def delete(self, sha256: str) -> None:
        key = blob_key(sha256)
        await self._run(
            "delete a blob", sha256, self._client.delete_object, Bucket=self.bucket, Key=key
        )

    async def list_blobs(self) -> AsyncIterator[StoredBlob]:
        await self._ensure_bucket()
        async for item in self._pages("list blobs", self._client.list_objects_v2, "Contents",
                                      ("ContinuationToken", "NextContinuationToken"),
                                      prefix="sha256/"):
            sha = sha256_of_key(item.get("Key", ""))
            if sha is not None and "LastModified" in item:
                yield StoredBlob(sha, item["LastModified"])

    async def check(self) -> None:
        # Always a round trip, even once the bucket is known: readiness must notice an
        # S3 that went away after start-up.
        if await self._head_bucket():
            return
        if not self._create_bucket:
            error = BlobStoreUnavailable(
                f"bucket {self.bucket!r} does not exist", detail={"bucket": self.bucket}
            )
            error.retryable = False
            raise error
        self._bucket_ready = False
        await self._ensure_bucket()

    async def _head_bucket(self) -> bool:
        """True when the bucket exists; False when S3 answers that it does not."""
        try:
            await self._run("check the bucket", None, self._client.head_bucket, Bucket=self.bucket)
        except BlobStoreUnavailable as exc:
            if exc.detail.get("s3_status") == 404:
                return False
            raise
        return True

    async def _ensure_bucket(self) -> None:
        if not self._create_bucket or self._bucket_ready:
            return
        async with self._bucket_lock:
            if self._bucket_ready:
                return
            if not await self._head_bucket():
                await self._create()
            self._bucket_ready = True

    async def _create(self) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            await self._run("create the bucket", None, self._client.create_bucket, **kwargs)
        except RegistryError as exc:
            # Another registry replica may have created it between our HEAD and PUT.
            if exc.detail.get("s3_code") != "BucketAlreadyOwnedByYou":
                raise

    async def close(self) -> None:
        self._client.close()
        self._upload_client.close()
        if self._presign_client is not self._client:
            self._presign_client.close()
