"""Turning a received upload into a validated, hashed set of files in staging."""

from __future__ import annotations

import asyncio
import errno
import logging
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from loraplane.digest import sha256_file, version_digest
from loraplane.lora.archive import extract_archive
from loraplane.lora.base_model import BaseModelShapes
from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.files import CONFIG_FILE, IGNORED_FILES, WEIGHTS_FILE, drop_ignored_files
from loraplane.lora.validate import (
    AdapterSummary,
    validate_adapter_dir,
    validate_streamed_adapter,
)
from registry_service.errors import InsufficientStorage, InvalidInput, LocalStorageError
from registry_service.settings import RegistrySettings
from registry_service.versions.upload import ReceivedUpload
from registry_service.versions.upload_sinks import ReceivedFile


@dataclass(frozen=True, slots=True)
class StagedVersion:
    files: list[ReceivedFile]
    summary: AdapterSummary
    digest: str

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def files_json(self) -> list[dict[str, object]]:
        return [{"name": f.name, "size": f.size, "sha256": f.sha256}
                for f in sorted(self.files, key=lambda f: f.name)]


log = logging.getLogger(__name__)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@contextmanager
def local_disk_errors() -> Iterator[None]:
    """Turn an OSError of the registry's own disk into a domain error.

    The OS's text names the server's paths, so it goes to the log, not to the client.
    """
    try:
        yield
    except OSError as exc:
        log.error("staging an upload failed: %s", exc)
        code = errno.errorcode.get(exc.errno or 0, "")
        if exc.errno in _DISK_FULL:
            raise InsufficientStorage("the registry's disk is full; try again later",
                                      detail={"errno": code}) from exc
        raise LocalStorageError("the registry could not write the upload to its disk",
                                detail={"errno": code}) from exc


@asynccontextmanager
async def staging_area(root: Path) -> AsyncIterator[Path]:
    """A private folder for one upload, removed afterwards whatever happened."""
    path = root / uuid.uuid4().hex
    with local_disk_errors():
        path.mkdir(parents=True)
    try:
        yield path
    finally:
        await asyncio.to_thread(shutil.rmtree, path, True)


def _hash_all(paths: list[Path]) -> list[ReceivedFile]:
    # Only archives' members are hashed here: every other file was hashed as it arrived.
    files = []
    for path in paths:
        size, sha = sha256_file(path)
        files.append(ReceivedFile(name=path.name, path=path, size=size, sha256=sha))
    return files


def _unpack(upload: ReceivedUpload, staging: Path, settings: RegistrySettings) -> tuple[
    Path, list[ReceivedFile]
]:
    received = [f for f in upload.files if f.name not in IGNORED_FILES]
    archive = upload.archive
    if archive is None:
        return staging, received
    if len(received) > 1:
        raise AdapterInvalid("unknown_file", "an archive must be the only file of an upload",
                             {"files": sorted(f.name for f in received)})
    assert archive.path is not None  # archives go to staging, never streamed
    dest = staging / "extracted"
    dest.mkdir()
    paths = extract_archive(archive.path, dest, max_total_bytes=settings.max_adapter_bytes,
                            max_members=settings.max_archive_members,
                            max_file_bytes=settings.max_file_bytes,
                            max_expansion_ratio=settings.max_archive_expansion_ratio)
    archive.path.unlink()
    return dest, _hash_all(drop_ignored_files(paths))


def _stage_sync(upload: ReceivedUpload, staging: Path, settings: RegistrySettings,
                base_model: str) -> StagedVersion:
    _check_declared(upload.files)
    folder, files = _unpack(upload, staging, settings)
    shapes = _base_shapes(settings, base_model)
    weights = upload.streams.get(WEIGHTS_FILE)
    if weights is not None and upload.archive is None:
        summary = validate_streamed_adapter(
            staging / CONFIG_FILE, [f.name for f in files], weights.check,
            expected_base_model=base_model, base_shapes=shapes)
    else:
        summary = validate_adapter_dir(folder, expected_base_model=base_model,
                                       base_shapes=shapes,
                                       max_header_bytes=settings.max_header_bytes)
    for warning in summary.warnings:
        log.info("upload for base model %r: %s", base_model, warning)
    digest = version_digest((f.name, f.size, f.sha256) for f in files)
    return StagedVersion(files=files, summary=summary, digest=digest)


def _check_declared(files: list[ReceivedFile]) -> None:
    for item in files:
        if item.declared_sha256 is not None and item.declared_sha256 != item.sha256:
            raise InvalidInput(
                f"{item.name} does not match the sha-256 its Content-Digest declares; it was "
                "changed or damaged on the way", code="digest_mismatch",
                detail={"file": item.name, "declared": item.declared_sha256,
                        "received": item.sha256})


def _base_shapes(settings: RegistrySettings, base_model: str) -> BaseModelShapes | None:
    try:
        return settings.base_shapes(base_model)
    except ValueError as exc:
        # The operator's config, not the upload, is at fault: a 5xx, not a refusal.
        log.error("%s", exc)
        raise LocalStorageError("the registry cannot read its config of this base model",
                                detail={"base_model": base_model}) from exc


async def stage_version(upload: ReceivedUpload, staging: Path, settings: RegistrySettings,
                        base_model: str) -> StagedVersion:
    """Unpack, hash and validate off the event loop (a 1 GB scan takes seconds)."""
    return await asyncio.to_thread(_stage_sync, upload, staging, settings, base_model)
