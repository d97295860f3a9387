"""Every refused upload answers a 4xx with its own code and leaves nothing behind."""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zipfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest

from devharness.adapters import make_adapter, safetensors_bytes, write_safetensors
from devharness.bombs import tar_bomb, zip_bomb
from devharness.registry import RegistryHarness
from devharness.uploads import (
    adapter_parts,
    count_rows,
    staging_leftovers,
    stored_blobs,
    upload,
)
from loraplane.lora.safetensors import read_header

Parts = list[tuple[str, tuple[str, bytes]]]


def _good(tmp: Path, **kwargs: object) -> Path:
    return make_adapter(tmp / "good", rank=8, seed=7, **kwargs)  # type: ignore[arg-type]


def _with_config(tmp: Path, **changes: object) -> Parts:
    folder = _good(tmp)
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(changes)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return adapter_parts(folder)


def _with_weights(tmp: Path, data: bytes) -> Parts:
    folder = _good(tmp)
    (folder / "adapter_model.safetensors").write_bytes(data)
    return adapter_parts(folder)


def _tar(entries: Callable[[tarfile.TarFile], None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        entries(tar)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes, kind: bytes = tarfile.REGTYPE,
         link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = (len(data) if kind == tarfile.REGTYPE else 0), kind, link
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _archive_with(tmp: Path, name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> Parts:
    folder = _good(tmp)

    def entries(tar: tarfile.TarFile) -> None:
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            _add(tar, file, (folder / file).read_bytes())
        _add(tar, name, b"x", kind, link)

    return [("files", ("adapter.tar.gz", _tar(entries)))]


def _bomb(tmp: Path) -> Parts:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        # Each member is under the per-file limit; together they expand past the total.
        for i in range(4):
            archive.writestr(f"part{i}.bin", b"\0" * (900 * 1024))
    return [("files", ("adapter.zip", buffer.getvalue()))]


def _over_adapter_limit(_: Path) -> Parts:
    # One random bit a byte compresses some 7 times, well within the ratio: only the
    # total (max_adapter_bytes) refuses these.
    buffer = io.BytesIO()
    rng = np.random.default_rng(3)
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for i in range(3):
            archive.writestr(f"part{i}.bin", rng.integers(0, 2, 600 * 1024, np.uint8).tobytes())
    return [("files", ("adapter.zip", buffer.getvalue()))]


def _nan(tmp: Path) -> Parts:
    return adapter_parts(make_adapter(tmp / "nan", seed=1, inject="nan"))


def _int_dtype(tmp: Path) -> Parts:
    folder = _good(tmp)
    weights = folder / "adapter_model.safetensors"
    header = read_header(weights)
    write_safetensors(weights, {name: np.zeros(info.shape, dtype=np.int32)
                                for name, info in header.tensors.items()})
    return adapter_parts(folder)


def _wrong_rank(tmp: Path) -> Parts:
    folder = make_adapter(tmp / "r4", rank=4, seed=1)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["r"] = 8
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return adapter_parts(folder)


def _too_big(tmp: Path) -> Parts:
    folder = _good(tmp)
    return [*adapter_parts(folder)[:1],
            ("files", ("adapter_model.safetensors", b"\0" * (1536 * 1024)))]


CASES: dict[str, tuple[Callable[[Path], Parts], int, str]] = {
    "no config": (lambda t: adapter_parts(_good(t))[1:], 422, "missing_config"),
    "no weights": (lambda t: adapter_parts(_good(t))[:1], 422, "missing_weights"),
    "not lora": (lambda t: _with_config(t, peft_type="PREFIX_TUNING"), 422, "invalid_config"),
    # Issue 35: Python's re took 15 s over this key at upload (vLLM uses Python's re).
    "backtracking rank_pattern": (lambda t: _with_config(t, rank_pattern={"l(.|.)*Z": 4}),
                                  422, "invalid_config"),
    "backtracking alpha_pattern": (lambda t: _with_config(t, alpha_pattern={"(a|aa)*b": 4}),
                                   422, "invalid_config"),
    "huge lora_alpha": (lambda t: _with_config(t, lora_alpha=1e308), 422, "invalid_config"),
    "tiny lora_alpha": (lambda t: _with_config(t, lora_alpha=1e-300), 422, "invalid_config"),
    "config not json": (lambda t: [("files", ("adapter_config.json", b"{nope")),
                                   *adapter_parts(_good(t))[1:]], 422, "invalid_config"),
    "other base model": (lambda t: _with_config(t, base_model_name_or_path="other-model"),
                         422, "base_model_mismatch"),
    "malformed header": (lambda t: _with_weights(t, struct.pack("<Q", 5) + b"{nope"),
                         422, "invalid_safetensors"),
    # The test registry caps headers at 512 bytes; a real adapter's header is larger.
    "oversized header": (lambda t: adapter_parts(_good(t)), 413, "safetensors_header_too_large"),
    # 1e200 as an int: formatting the size it needs once overflowed a float (a 500).
    "huge shape": (lambda t: _with_weights(t, safetensors_bytes(
        {"a": {"dtype": "F32", "shape": [10**200, 10**200], "data_offsets": [0, 4]}},
        data=b"\0" * 4)), 422, "invalid_safetensors"),
    "header longer than file": (lambda t: _with_weights(t, struct.pack("<Q", 2**40) + b"{}"),
                                422, "safetensors_size_mismatch"),
    "header disagrees with file": (
        lambda t: _with_weights(t, (_good(t) / "adapter_model.safetensors").read_bytes()[:-16]),
        422, "safetensors_size_mismatch"),
    "rank disagrees with config": (_wrong_rank, 422, "tensor_mismatch"),
    "integer tensors": (_int_dtype, 422, "invalid_dtype"),
    "nan values": (_nan, 422, "non_finite_values"),
    "file over the limit": (_too_big, 413, "file_too_large"),
    "unknown file": (lambda t: [*adapter_parts(_good(t)), ("files", ("model.bin", b"x"))],
                     422, "unknown_file"),
    "archive absolute path": (lambda t: _archive_with(t, "/etc/evil"), 422, "unsafe_archive"),
    "archive dot-dot": (lambda t: _archive_with(t, "../evil"), 422, "unsafe_archive"),
    "archive symlink": (lambda t: _archive_with(t, "link", tarfile.SYMTYPE, "/etc/passwd"),
                        422, "unsafe_archive"),
    "archive hardlink": (lambda t: _archive_with(t, "hard", tarfile.LNKTYPE,
                                                 "adapter_config.json"), 422, "unsafe_archive"),
    "archive expansion": (_bomb, 413, "archive_too_large"),
    "archive over the adapter limit": (_over_adapter_limit, 413, "archive_too_large"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_bad_upload_is_refused_and_leaves_nothing(
    registry: RegistryHarness, tmp_path: Path, case: str
) -> None:
    build, status, code = CASES[case]
    registry.ctx.settings.max_file_bytes = 1024 * 1024
    registry.ctx.settings.max_upload_bytes = 2 * 1024 * 1024
    registry.ctx.settings.max_adapter_bytes = 1536 * 1024
    if case == "oversized header":
        registry.ctx.settings.max_header_bytes = 512
    await registry.create_adapter("bot")
    response = await upload(registry, "bot", build(tmp_path))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["message"]
    assert await count_rows(registry) == (0, 1)  # adapter_created only
    assert await stored_blobs(registry) == []
    assert staging_leftovers(registry) == []
    # The service keeps running: a good upload still works afterwards.
    registry.ctx.settings.max_header_bytes = 16 * 1024 * 1024
    good = await upload(registry, "bot", adapter_parts(make_adapter(tmp_path / "ok", seed=9)))
    assert good.status_code == 201, good.text


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
async def test_a_zip_bomb_is_refused_with_the_default_limits(
    registry: RegistryHarness, tmp_path: Path, kind: str
) -> None:
    # 64 MiB of zeros in a few hundred KB: under every size limit but the ratio's.
    bomb = zip_bomb(tmp_path / "b") if kind == "zip" else tar_bomb(tmp_path / "b")
    assert bomb.stat().st_size < 512 * 1024
    await registry.create_adapter("bot")
    response = await upload(registry, "bot", [("files", (f"a.{kind}", bomb.read_bytes()))])
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "archive_expansion_ratio"
    assert error["detail"]["max_expansion_ratio"] == 100
    assert await count_rows(registry) == (0, 1)  # adapter_created only
    assert await stored_blobs(registry) == []
    assert staging_leftovers(registry) == []


@pytest.mark.parametrize(("body", "content_type", "code"), [
    (b"plain", "text/plain", "not_multipart"),
    (b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"adapter_config.json\""
     b"\r\n\r\n{}", "multipart/form-data; boundary=b", "incomplete_upload"),
    (b"--b\r\nContent-Disposition: form-data; name=\"evil\"\r\n\r\nx\r\n--b--\r\n",
     "multipart/form-data; boundary=b", "unknown_field"),
])
async def test_malformed_bodies_answer_400(embedded_registry: RegistryHarness, body: bytes,
                                           content_type: str, code: str) -> None:
    registry = embedded_registry
    await registry.create_adapter("bot")
    response = await registry.client.post(
        "/v1/adapters/bot/versions", content=body,
        headers={**registry.admin_headers, "Content-Type": content_type})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == code
    assert await count_rows(registry) == (0, 1)  # adapter_created only
    assert staging_leftovers(registry) == []


async def test_bad_alias_name_is_refused_before_anything_is_stored(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    registry = embedded_registry
    await registry.create_adapter("bot")
    response = await upload(registry, "bot", adapter_parts(_good(tmp_path)), aliases="Bad Alias")
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_alias"
    assert await count_rows(registry) == (0, 1)  # adapter_created only
    assert await stored_blobs(registry) == []


@pytest.mark.parametrize(("adapter", "token", "status", "code"), [
    ("nope", "admin", 404, "adapter_not_found"),
    ("bot", "reader", 403, "insufficient_role"),
])
async def test_a_refused_caller_is_answered_before_the_body_is_read(
    embedded_registry: RegistryHarness, adapter: str, token: str, status: int, code: str
) -> None:
    registry = embedded_registry
    await registry.create_adapter("bot")
    headers = registry.admin_headers if token == "admin" else await registry.token(token, "acme")
    chunks_read: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        for n in range(3):
            chunks_read.append(n)
            yield b"x" * 1024

    response = await registry.client.post(
        f"/v1/adapters/{adapter}/versions", content=body(),
        headers={**headers, "Content-Type": "multipart/form-data; boundary=b"})
    assert response.status_code == status and response.json()["error"]["code"] == code
    # The check comes first, so nothing of a refused upload is streamed to staging.
    assert chunks_read == []
    assert staging_leftovers(registry) == []
