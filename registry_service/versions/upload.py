"""Receiving a version upload: a streaming multipart parser.

The weights file goes straight on to the blob store while it is hashed, counted and
checked (``SafetensorsStream``): one pass over its bytes, none of them on local disk.
Other parts (the config, an archive) go to staging. Memory stays flat whatever the size,
and a limit is enforced the moment it is crossed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.files import ALLOWED_FILES, IGNORED_FILES, WEIGHTS_FILE
from loraplane.lora.safetensors_stream import SafetensorsStream
from registry_service.blobs.base import BlobWriter
from registry_service.errors import BadRequest, PayloadTooLarge
from registry_service.versions.upload_sinks import FileSink as _FileSink
from registry_service.versions.upload_sinks import ReceivedFile
from registry_service.versions.upload_sinks import StreamSink as _StreamSink

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
FORM_FIELDS = ("aliases", "notes", "allow_shape_change", "abort_canary")
MAX_FIELD_BYTES = 64 * 1024
# The longest name a file system takes for one path component.
MAX_FILENAME_BYTES = 255


@dataclass(frozen=True, slots=True)
class UploadLimits:
    max_file_bytes: int
    max_upload_bytes: int


@dataclass(frozen=True, slots=True)
class UploadBody:
    """A version upload as the HTTP layer hands it over: the multipart body, not yet read."""

    content_type: str | None
    content_length: str | None
    chunks: AsyncIterator[bytes]


@dataclass(frozen=True, slots=True)
class StreamTarget:
    """Where the weights file streams to: a new blob of the store, checked as it passes."""

    open_writer: Callable[[str | None], Awaitable[BlobWriter]]
    max_header_bytes: int



@dataclass(frozen=True, slots=True)
class StreamedFile:
    writer: BlobWriter
    check: SafetensorsStream


@dataclass
class ReceivedUpload:
    files: list[ReceivedFile] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)
    streams: dict[str, StreamedFile] = field(default_factory=dict)

    async def abort_streams(self) -> None:
        """Discard every streamed blob not finished (a refusal leaves nothing)."""
        for streamed in self.streams.values():
            await streamed.writer.abort()

    @property
    def archive(self) -> ReceivedFile | None:
        found = [f for f in self.files if is_archive(f.name)]
        return found[0] if found else None


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _check_filename(filename: str) -> str:
    if not filename or any(c in filename for c in "/\\\x00") or filename in (".", ".."):
        raise AdapterInvalid("unknown_file", f"file name {filename!r} is not a plain name",
                             {"file": filename})
    if len(filename.encode()) > MAX_FILENAME_BYTES:
        raise AdapterInvalid(
            "unknown_file", f"file name {filename[:64]!r}... is longer than "
            f"{MAX_FILENAME_BYTES} bytes", {"file": filename[:64]})
    if filename not in (*ALLOWED_FILES, *IGNORED_FILES) and not is_archive(filename):
        raise AdapterInvalid(
            "unknown_file",
            f"unexpected file {filename!r}; send {', '.join(ALLOWED_FILES)} or one "
            f"archive ({', '.join(ARCHIVE_SUFFIXES)})",
            {"file": filename, "allowed": list(ALLOWED_FILES)},
        )
    return filename


class _Receiver:
    """State of one multipart body being written to ``staging``.

    The parser's callbacks run inside the event loop, so they only buffer; the caller
    flushes full buffers and finished files to disk in a thread (``due``).
    """

    def __init__(self, staging: Path, limits: UploadLimits,
                 stream: StreamTarget | None) -> None:
        self.staging, self.limits, self.stream = staging, limits, stream
        self.result = ReceivedUpload()
        self.ended = False
        self.sinks: list[_FileSink] = []
        self._header_field = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._field: str | None = None
        self._field_value = bytearray()
        self._file: _FileSink | None = None
        # The flush a thread is doing; ``run_in_executor`` submits at once, so it always
        # runs to its end, even when whoever awaited it was cancelled.
        self.flushing: asyncio.Future[None] | None = None

    async def wait_flushed(self) -> None:
        """Wait for the flush on its way, and raise what it raised."""
        if self.flushing is not None:
            await asyncio.shield(self.flushing)
            self.flushing = None

    def start_flush(self, sinks: list[_FileSink]) -> None:
        for sink in sinks:
            sink.take()
        self.flushing = asyncio.get_running_loop().run_in_executor(None, _flush_all, sinks)

    async def settle(self) -> None:
        """After a failure: no thread may still write when the streams are aborted."""
        flushing, self.flushing = self.flushing, None
        if flushing is not None:
            await asyncio.wait([flushing])
            if not flushing.cancelled():
                flushing.exception()  # the failure being handled is the one reported

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin, "on_header_field": self._header_field_cb,
            "on_header_value": self._header_value_cb, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
            "on_part_end": self._part_end, "on_end": self._end,
        }

    def due(self, *, everything: bool = False) -> list[_FileSink]:
        return [s for s in self.sinks if s.pending_bytes and (
            everything or s.finished or s.pending_bytes >= s.flush_bytes)]

    def unopened(self) -> list[_StreamSink]:
        return [s for s in self.sinks if isinstance(s, _StreamSink) and s.writer is None]

    def _part_begin(self) -> None:
        self._headers = {}

    def _header_field_cb(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _header_value_cb(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field, self._header_value = b"", b""

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        filename = params.get(b"filename")
        if filename is not None:
            self._open_file(_check_filename(filename.decode("utf-8", "replace")),
                            _declared_sha256(self._headers.get(b"content-digest")))
        elif name in FORM_FIELDS:
            self._field, self._field_value = name, bytearray()
        else:
            raise BadRequest(f"unknown form field {name!r}", code="unknown_field",
                             detail={"field": name, "allowed": ["files", *FORM_FIELDS]})

    def _open_file(self, filename: str, declared: str | None) -> None:
        if any(sink.name == filename for sink in self.sinks):
            raise BadRequest(f"file {filename!r} was sent twice", code="duplicate_file",
                             detail={"file": filename})
        if filename == WEIGHTS_FILE and self.stream is not None:
            self._file = _StreamSink(filename, declared, self.stream.max_header_bytes)
        else:
            self._file = _FileSink(filename, self.staging / filename, declared)
        self.sinks.append(self._file)

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._file is not None:
            if self._file.size + len(chunk) > self.limits.max_file_bytes:
                raise AdapterInvalid(
                    "file_too_large", f"{self._file.name} is over {self.limits.max_file_bytes} "
                    "bytes", {"file": self._file.name, "limit": self.limits.max_file_bytes})
            self._file.add(chunk)
        elif self._field is not None:
            self._field_value += chunk
            if len(self._field_value) > MAX_FIELD_BYTES:
                raise PayloadTooLarge(f"form field {self._field!r} is too long",
                                      code="field_too_large", detail={"field": self._field})

    def _part_end(self) -> None:
        if self._file is not None:
            self._file.finished = True
            self._file = None
        elif self._field is not None:
            self.result.fields[self._field] = self._field_value.decode("utf-8", "replace")
            self._field = None

    def _end(self) -> None:
        self.ended = True

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def streams(self) -> dict[str, StreamedFile]:
        return {s.name: StreamedFile(s.writer, s.check) for s in self.sinks
                if isinstance(s, _StreamSink) and s.writer is not None}


def _declared_sha256(header: bytes | None) -> str | None:
    """The sha-256 of an RFC 9530 ``Content-Digest`` part header, as lowercase hex."""
    if header is None:
        return None
    for item in header.decode("latin-1").split(","):
        algorithm, _, value = item.strip().partition("=")
        if algorithm.strip().lower() != "sha-256":
            continue
        value = value.strip()
        try:
            raw = base64.b64decode(value[1:-1], validate=True) if value[:1] == ":" == value[-1:] \
                else b""
        except binascii.Error:
            raw = b""
        if len(raw) != 32:
            raise BadRequest("a Content-Digest header is not sha-256=:<base64 of 32 bytes>:",
                             code="invalid_digest", detail={"header": header[:200].decode(
                                 "latin-1")})
        return raw.hex()
    return None


def _boundary(content_type: str | None) -> bytes:
    kind, params = parse_options_header(content_type or "")
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise BadRequest("send the version as multipart/form-data", code="not_multipart",
                         detail={"content_type": content_type or ""})
    return boundary


async def receive_upload(body: UploadBody, staging: Path, limits: UploadLimits, *,
                         on_bytes: Callable[[int], None] = lambda _: None,
                         stream: StreamTarget | None = None) -> ReceivedUpload:
    """Stream a multipart body into ``staging`` (and the weights to ``stream``); refuse it
    as soon as a limit is crossed. Streamed blobs are aborted when this raises.

    ``on_bytes`` hears of every chunk as it arrives, refused uploads' included."""
    boundary = _boundary(body.content_type)
    length = body.content_length
    declared = int(length) if length and length.isdigit() else 0
    if declared > limits.max_upload_bytes:
        raise _upload_too_large(limits)
    receiver = _Receiver(staging, limits, stream)
    try:
        await _read_body(body, boundary, receiver, limits, on_bytes)
    except BaseException:
        await receiver.settle()
        receiver.close()
        await ReceivedUpload(streams=receiver.streams()).abort_streams()
        raise
    receiver.close()
    result = receiver.result
    result.files = [sink.received() for sink in receiver.sinks]
    result.streams = receiver.streams()
    if not result.files:
        raise AdapterInvalid("missing_config", "the upload has no files")
    return result


async def _read_body(body: UploadBody, boundary: bytes, receiver: _Receiver,
                     limits: UploadLimits, on_bytes: Callable[[int], None]) -> None:
    parser = MultipartParser(boundary, receiver.callbacks())  # type: ignore[arg-type]
    total = 0
    try:
        async for chunk in body.chunks:
            on_bytes(len(chunk))
            total += len(chunk)
            if total > limits.max_upload_bytes:
                raise _upload_too_large(limits)
            parser.write(chunk)
            await _flush(receiver)
        parser.finalize()
        await _flush(receiver, everything=True)
        await receiver.wait_flushed()
    except MultipartParseError as exc:
        raise BadRequest("the multipart body is malformed", code="malformed_multipart",
                         detail={"reason": str(exc)[:200]}) from exc
    if not receiver.ended:
        raise BadRequest("the multipart body ended early", code="incomplete_upload")


async def _flush(receiver: _Receiver, *, everything: bool = False) -> None:
    """Hand full buffers to a thread, which works on them while the next bytes are read.

    One flush at a time: the next waits for the last, so at most two batches are held."""
    for streamed in receiver.unopened():
        assert receiver.stream is not None
        streamed.writer = await receiver.stream.open_writer(streamed.declared)
    due = receiver.due(everything=everything)
    if not due:
        return
    await receiver.wait_flushed()
    receiver.start_flush(due)


def _flush_all(sinks: list[_FileSink]) -> None:
    for sink in sinks:
        sink.flush()


def _upload_too_large(limits: UploadLimits) -> PayloadTooLarge:
    return PayloadTooLarge(f"the upload is over {limits.max_upload_bytes} bytes",
                           code="upload_too_large", detail={"limit": limits.max_upload_bytes})
