"""A ``multipart/form-data`` body generated from file chunks, with a known length.

Adapter weights can be gigabytes, so a body is never built in memory: file parts are
read in chunks as the request is sent. The exact ``Content-Length`` is computed up front
from the part headers and the file sizes, which lets the registry refuse an oversized
upload before it reads a byte of it, and avoids chunked transfer encoding.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loraplane.client.errors import InvalidSource
from loraplane.digest import sha256_file
from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.files import ALLOWED_FILES, list_adapter_files

CRLF = b"\r\n"
DEFAULT_CHUNK_SIZE = 1024 * 1024
ADAPTER_FILES = ALLOWED_FILES
ARCHIVE_TYPES = {
    ".tar.gz": "application/gzip",
    ".tgz": "application/gzip",
    ".tar": "application/x-tar",
    ".zip": "application/zip",
}

# Called with (bytes sent so far, total bytes) as the body is sent.
OnProgress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class FieldPart:
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class FilePart:
    name: str
    path: Path
    size: int
    filename: str
    content_type: str = "application/octet-stream"
    # Sent as the part's Content-Digest: the registry can then stream the file straight
    # to its final place in the blob store (it still checks the bytes against it).
    sha256: str | None = None

    @classmethod
    def of(cls, name: str, path: Path, *, filename: str | None = None,
           content_type: str = "application/octet-stream",
           with_digest: bool = False) -> FilePart:
        try:
            size = path.stat().st_size
            sha = sha256_file(path)[1] if with_digest else None
        except OSError as exc:
            raise InvalidSource(f"cannot read {path}: {exc.strerror or exc}",
                                code="file_unreadable") from exc
        return cls(name=name, path=path, size=size, filename=filename or path.name,
                   content_type=content_type, sha256=sha)


# Above this, a push checks the adapter before it hashes and sends the files: an
# unknown name or a missing permission then costs no pass over the bytes. Below it, the
# upload's own refusal is as quick, and the check would be a round trip on every push.
CHECK_FIRST_ABOVE_BYTES = 1 << 20


def check_first(source: Path | Sequence[FilePart]) -> bool:
    """Whether a push of ``source`` should check the adapter before sending: when it
    is over ``CHECK_FIRST_ABOVE_BYTES``, or its size cannot be told from the files."""
    if not isinstance(source, Path):
        return sum(part.size for part in source) > CHECK_FIRST_ABOVE_BYTES
    paths = [source / n for n in ADAPTER_FILES] if source.is_dir() else [source]
    try:
        return sum(p.stat().st_size for p in paths) > CHECK_FIRST_ABOVE_BYTES
    except OSError:
        return True  # collect_files says what is wrong, after the check


def _folder_files(source: Path) -> list[FilePart]:
    """The two adapter files of a folder, judged by the rules the registry applies to an
    archive's members (``loraplane.lora.files``): README.md and tokenizer files are
    dropped, any other file is refused, pickle weights get a hint to re-save them."""
    try:
        list_adapter_files(source)
    except AdapterInvalid as exc:
        code = "missing_file" if exc.code.startswith("missing_") else exc.code
        raise InvalidSource(f"{source}: {exc.message}", code=code) from exc
    except OSError as exc:
        raise InvalidSource(f"cannot read {source}: {exc.strerror or exc}",
                            code="file_unreadable") from exc
    return [FilePart.of("files", source / n, with_digest=True) for n in ADAPTER_FILES]


def collect_files(source: Path) -> list[FilePart]:
    """The parts to send for a PEFT folder (its two adapter files) or for one archive."""
    if source.is_dir():
        return _folder_files(source)
    if source.is_file():
        lowered = source.name.lower()
        for suffix, content_type in ARCHIVE_TYPES.items():
            if lowered.endswith(suffix):
                return [FilePart.of("files", source, content_type=content_type)]
        raise InvalidSource(
            f"{source} is neither an adapter folder nor an archive ({', '.join(ARCHIVE_TYPES)})",
            code="not_an_adapter")
    raise InvalidSource(f"{source} does not exist", code="not_found")


def _quote(value: str) -> str:
    # The HTML form encoding: these three would end the quoted string or the header.
    return value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


def _headers(part: FieldPart | FilePart) -> bytes:
    disposition = f'form-data; name="{_quote(part.name)}"'
    lines = []
    if isinstance(part, FilePart):
        disposition += f'; filename="{_quote(part.filename)}"'
        lines.append(f"Content-Type: {part.content_type}")
        if part.sha256 is not None:
            encoded = base64.b64encode(bytes.fromhex(part.sha256)).decode()
            lines.append(f"Content-Digest: sha-256=:{encoded}:")
    lines.insert(0, f"Content-Disposition: {disposition}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class MultipartBody:
    """A ``multipart/form-data`` body; iterate it (sync or async) once per request."""

    def __init__(self, fields: Sequence[FieldPart], files: Sequence[FilePart], *,
                 boundary: str | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 on_progress: OnProgress | None = None) -> None:
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        self.boundary = boundary or f"loraplane-{secrets.token_hex(16)}"
        self.chunk_size = chunk_size
        self.on_progress = on_progress
        self._parts: list[FieldPart | FilePart] = [*fields, *files]
        delimiter = b"--" + self.boundary.encode("ascii") + CRLF
        self._heads = [delimiter + _headers(part) for part in self._parts]
        self._closing = b"--" + self.boundary.encode("ascii") + b"--" + CRLF

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    @property
    def content_length(self) -> int:
        total = len(self._closing)
        for head, part in zip(self._heads, self._parts, strict=True):
            size = part.size if isinstance(part, FilePart) else len(part.value.encode())
            total += len(head) + size + len(CRLF)
        return total

    @property
    def headers(self) -> dict[str, str]:
        return {"Content-Type": self.content_type, "Content-Length": str(self.content_length)}

    def __iter__(self) -> Iterator[bytes]:
        total, sent = self.content_length, 0
        if self.on_progress is not None:
            self.on_progress(0, total)
        for chunk in self._chunks():
            sent += len(chunk)
            yield chunk
            if self.on_progress is not None:
                self.on_progress(sent, total)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # Local reads of one chunk are short; the event loop waits on the socket anyway.
        for chunk in self:
            yield chunk

    def _chunks(self) -> Iterator[bytes]:
        for head, part in zip(self._heads, self._parts, strict=True):
            if isinstance(part, FilePart):
                yield head
                yield from self._file_chunks(part)
                yield CRLF
            else:
                yield head + part.value.encode() + CRLF
        yield self._closing

    def _file_chunks(self, part: FilePart) -> Iterator[bytes]:
        remaining = part.size
        try:
            with part.path.open("rb") as handle:
                while remaining > 0:
                    chunk = handle.read(min(self.chunk_size, remaining))
                    if not chunk:
                        break
                    remaining -= len(chunk)
                    yield chunk
                grew = bool(handle.read(1))
        except OSError as exc:
            raise InvalidSource(f"cannot read {part.path}: {exc.strerror or exc}",
                                code="file_unreadable") from exc
        # The length was promised in Content-Length: a file that changed under us would
        # send a body that is corrupt or cut short, so stop rather than send it.
        if remaining or grew:
            raise InvalidSource(f"{part.path} changed while it was being uploaded",
                                code="file_changed")
