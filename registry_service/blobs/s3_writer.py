"""Writing one S3 blob while its bytes arrive: a multipart upload fed part by part.

The blob's key is its sha256, known for certain only once the last byte is in. When the
client declared the digest up front the parts go to the final key, and nothing is
visible there until ``finish`` completes the upload after every check has passed.
Otherwise they go to a temporary key under ``uploads/``, which ``finish`` copies to the
final key server-side and deletes. ``abort`` (or a crash, then the blob collector's
sweep) leaves no object and no multipart upload behind.

``write`` runs in a worker thread. Parts are sent by a small pool of threads; ``write``
blocks while ``parts_in_flight`` parts are on their way, so memory is bounded by
``(parts_in_flight + 1) * part_size`` whatever the blob's size.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from boto3.s3.transfer import TransferConfig

from loraplane.buffers import copy_into
from registry_service.blobs.base import blob_key
from registry_service.errors import BlobNotFound, BlobStoreUnavailable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

UPLOADS_PREFIX = "uploads/"
_CONTENT_TYPE = "application/octet-stream"


class S3BlobWriter:
    """One blob on its way into ``bucket``; see the module docstring."""

    def __init__(self, client: S3Client, bucket: str, *, final_key: str | None,
                 part_size: int, parts_in_flight: int, copy_config: TransferConfig,
                 map_error: Callable[[Exception], Exception], discard: bool = False) -> None:
        self._client, self._bucket = client, bucket
        self.key = final_key or f"{UPLOADS_PREFIX}{uuid.uuid4().hex}"
        self.temporary = final_key is None
        # The blob is stored already: the bytes are only counted, nothing is sent.
        self.discard = discard
        self._part_size, self._copy_config, self._map_error = part_size, copy_config, map_error
        self._free: list[bytearray] = []
        self._buffer: bytearray | None = None
        self._filled = 0
        self.written = 0
        self._upload_id: str | None = None
        self._etags: dict[int, str] = {}
        self._futures: list[Future[None]] = []
        self._slots = threading.BoundedSemaphore(parts_in_flight)
        self._pool = ThreadPoolExecutor(parts_in_flight, thread_name_prefix="s3-part")
        self._lock = threading.Lock()
        self._completed = False  # the temporary object exists
        self._finished = False

    # --- while the bytes arrive (a worker thread) ------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)
        if self.discard:
            return
        self._raise_failed()
        view = memoryview(data)
        while view:
            if self._buffer is None:
                self._buffer = self._take_buffer()
            take = min(len(view), self._part_size - self._filled)
            if len(self._buffer) < self._filled + take:  # the first part's, growing
                self._buffer += view[:take]
            else:
                copy_into(self._buffer, self._filled, view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self._part_size:
                self._send_part(self._buffer)
                self._buffer, self._filled = None, 0

    def _take_buffer(self) -> bytearray:
        with self._lock:
            # Buffers come back as parts finish: at most parts_in_flight + 1 ever exist.
            if self._free:
                return self._free.pop()
        # The first part's buffer grows with what arrives: most blobs (a config, a small
        # adapter's weights) are far under one part, and a whole zeroed part for each
        # cost more CPU than the rest of their upload. Later ones are whole parts.
        return bytearray(self._part_size) if self._futures else bytearray()

    def _send_part(self, buffer: bytearray) -> None:
        if self._upload_id is None:
            self._upload_id = self._call(self._client.create_multipart_upload,
                                         Bucket=self._bucket, Key=self.key,
                                         ContentType=_CONTENT_TYPE)["UploadId"]
        number = len(self._futures) + 1
        self._slots.acquire()
        try:
            self._futures.append(self._pool.submit(self._put_part, number, buffer))
        except BaseException:
            self._slots.release()
            raise

    def _put_part(self, number: int, buffer: bytearray) -> None:
        try:
            answer = self._client.upload_part(Bucket=self._bucket, Key=self.key,
                                              UploadId=str(self._upload_id),
                                              PartNumber=number,
                                              # botocore takes a bytearray: no copy
                                              Body=buffer)  # type: ignore[arg-type]
            self._etags[number] = answer["ETag"]
        finally:
            with self._lock:
                self._free.append(buffer)
            self._slots.release()

    def _raise_failed(self) -> None:
        for future in self._futures:
            if future.done() and future.exception() is not None:
                error = future.exception()
                assert isinstance(error, Exception)
                raise self._map_error(error) from error

    def _call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except Exception as exc:
            raise self._map_error(exc) from exc

    # --- at the end (a worker thread) -------------------------------------------------------

    def complete(self) -> None:
        """Send what is left and wait for every part: the bytes are all in S3 (unseen)."""
        if self.discard or self._upload_id is None:
            return
        if self._filled:
            assert self._buffer is not None
            self._send_part(self._buffer[:self._filled])
            self._buffer, self._filled = None, 0
        for future in self._futures:
            future.exception()
        self._raise_failed()

    def publish(self, sha256: str, exists: Callable[[], bool]) -> None:
        """Make the bytes the blob ``sha256``: the one step that makes them visible."""
        final = blob_key(sha256)
        if self.discard:
            if not exists():
                error = BlobStoreUnavailable(
                    "the stored copy of this blob was removed while it was uploaded; send "
                    "it again", code="blob_being_collected", detail={"sha256": sha256})
                raise error
            return
        if self._upload_id is None:
            # Under one part: a single PUT, straight to the final key (the digest is known).
            data = b"" if self._buffer is None else self._buffer[:self._filled]
            self._call(self._client.put_object, Bucket=self._bucket, Key=final, Body=data,
                       ContentType=_CONTENT_TYPE)
            return
        else:
            parts = [{"PartNumber": n, "ETag": self._etags[n]} for n in sorted(self._etags)]
            self._call(self._client.complete_multipart_upload, Bucket=self._bucket,
                       Key=self.key, UploadId=self._upload_id,
                       MultipartUpload={"Parts": parts})
            self._upload_id = None
        self._completed = True
        if self.temporary:
            if not exists():
                self._call(self._client.copy, CopySource={"Bucket": self._bucket, "Key": self.key},
                           Bucket=self._bucket, Key=final, Config=self._copy_config)
            self._call(self._client.delete_object, Bucket=self._bucket, Key=self.key)

    async def finish(self, sha256: str, size: int) -> None:
        """Make the bytes written the blob ``sha256``, after every check has passed."""
        if self.written != size:
            raise ValueError(f"{self.written} bytes were written, not {size}")
        await asyncio.to_thread(self._finish_sync, sha256)

    def _finish_sync(self, sha256: str) -> None:
        self.complete()
        self.publish(sha256, self._exists(sha256))
        self._finished = True
        self.close()

    def _exists(self, sha256: str) -> Callable[[], bool]:
        def head() -> bool:
            try:
                self._client.head_object(Bucket=self._bucket, Key=blob_key(sha256))
            except Exception as exc:
                mapped = self._map_error(exc)
                if isinstance(mapped, BlobNotFound):
                    return False
                raise mapped from exc
            return True
        return head

    async def abort(self) -> None:
        if not self._finished:
            await asyncio.to_thread(self._abort_sync)

    def _abort_sync(self) -> None:
        """Leave nothing: no open multipart upload, no temporary object. Best effort."""
        for future in self._futures:
            future.exception()  # a part still on its way could land after the abort
        try:
            if self._upload_id is not None:
                self._client.abort_multipart_upload(Bucket=self._bucket, Key=self.key,
                                                    UploadId=self._upload_id)
                self._upload_id = None
            elif self.temporary and self._completed:
                self._client.delete_object(Bucket=self._bucket, Key=self.key)
        except Exception as exc:  # the collector's sweep removes what this leaves
            log.warning("could not abort the upload of %s: %s", self.key, exc)
        finally:
            self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._free.clear()
        self._buffer = None
