"""Receiving a version upload: a streaming multipart parser that writes to staging.

Each file part goes straight to disk while it is hashed and counted, so memory stays
flat whatever the size, and a limit is enforced the moment it is crossed.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.validate import ALLOWED_FILES, IGNORED_FILES
from registry_service.errors import BadRequest, PayloadTooLarge

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
FORM_FIELDS = ("aliases", "notes")
MAX_FIELD_BYTES = 64 * 1024
# The longest name a file system takes for one path component.
MAX_FILENAME_BYTES = 255
# Bytes buffered per file before one write + hash in a worker thread.
FLUSH_BYTES = 4 * 1024 * 1024


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
class ReceivedFile:
    name: str
    path: Path
    size: int
    sha256: str


@dataclass
class ReceivedUpload:
    files: list[ReceivedFile] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)

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


class _FileSink:
    """One file part: bytes are buffered here and written and hashed in a worker thread."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path
        self.size = 0
        self.finished = False
        self._handle: BinaryIO = path.open("xb")
        self._digest = hashlib.sha256()
        self._pending: list[bytes] = []
        self.pending_bytes = 0

    def add(self, chunk: bytes) -> None:
        self._pending.append(chunk)
        self.pending_bytes += len(chunk)
        self.size += len(chunk)

    def flush(self) -> None:
        """Runs in a thread: hashing and file writes release the GIL."""
        data, self._pending, self.pending_bytes = b"".join(self._pending), [], 0
        self._digest.update(data)
        self._handle.write(data)
        if self.finished:
            self._handle.close()

    def close(self) -> None:
        self._handle.close()

    def received(self) -> ReceivedFile:
        return ReceivedFile(name=self.name, path=self.path, size=self.size,
                            sha256=self._digest.hexdigest())


class _Receiver:
    """State of one multipart body being written to ``staging``.

    The parser's callbacks run inside the event loop, so they only buffer; the caller
    flushes full buffers and finished files to disk in a thread (``due``).
    """

    def __init__(self, staging: Path, limits: UploadLimits) -> None:
        self.staging, self.limits = staging, limits
        self.result = ReceivedUpload()
        self.ended = False
        self.sinks: list[_FileSink] = []
        self._header_field = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._field: str | None = None
        self._field_value = bytearray()
        self._file: _FileSink | None = None

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin, "on_header_field": self._header_field_cb,
            "on_header_value": self._header_value_cb, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
            "on_part_end": self._part_end, "on_end": self._end,
        }

    def due(self, *, everything: bool = False) -> list[_FileSink]:
        return [s for s in self.sinks if s.pending_bytes and (
            everything or s.finished or s.pending_bytes >= FLUSH_BYTES)]

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
            self._open_file(_check_filename(filename.decode("utf-8", "replace")))
        elif name in FORM_FIELDS:
            self._field, self._field_value = name, bytearray()
        else:
            raise BadRequest(f"unknown form field {name!r}", code="unknown_field",
                             detail={"field": name, "allowed": ["files", *FORM_FIELDS]})

    def _open_file(self, filename: str) -> None:
        if any(sink.name == filename for sink in self.sinks):
            raise BadRequest(f"file {filename!r} was sent twice", code="duplicate_file",
                             detail={"file": filename})
        self._file = _FileSink(filename, self.staging / filename)
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


def _boundary(content_type: str | None) -> bytes:
    kind, params = parse_options_header(content_type or "")
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise BadRequest("send the version as multipart/form-data", code="not_multipart",
                         detail={"content_type": content_type or ""})
    return boundary


async def receive_upload(body: UploadBody, staging: Path, limits: UploadLimits, *,
                         on_bytes: Callable[[int], None] = lambda _: None) -> ReceivedUpload:
    """Stream a multipart body into ``staging``; refuse it as soon as a limit is crossed.

    ``on_bytes`` hears of every chunk as it arrives, refused uploads' included."""
    boundary = _boundary(body.content_type)
    length = body.content_length
    declared = int(length) if length and length.isdigit() else 0
    if declared > limits.max_upload_bytes:
        raise _upload_too_large(limits)
    receiver = _Receiver(staging, limits)
    parser = MultipartParser(boundary, receiver.callbacks())  # type: ignore[arg-type]
    total = 0
    try:
        async for chunk in body.chunks:
            on_bytes(len(chunk))
            total += len(chunk)
            if total > limits.max_upload_bytes:
                raise _upload_too_large(limits)
            parser.write(chunk)
            for sink in receiver.due():
                await asyncio.to_thread(sink.flush)
        parser.finalize()
        for sink in receiver.due(everything=True):
            await asyncio.to_thread(sink.flush)
    except MultipartParseError as exc:
        raise BadRequest("the multipart body is malformed", code="malformed_multipart",
                         detail={"reason": str(exc)[:200]}) from exc
    finally:
        receiver.close()
    if not receiver.ended:
        raise BadRequest("the multipart body ended early", code="incomplete_upload")
    receiver.result.files = [sink.received() for sink in receiver.sinks]
    if not receiver.result.files:
        raise AdapterInvalid("missing_config", "the upload has no files")
    return receiver.result


def _upload_too_large(limits: UploadLimits) -> PayloadTooLarge:
    return PayloadTooLarge(f"the upload is over {limits.max_upload_bytes} bytes",
                           code="upload_too_large", detail={"limit": limits.max_upload_bytes})
