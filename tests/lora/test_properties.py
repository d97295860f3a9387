"""Property tests: whatever bytes arrive, the safetensors header parser and the archive
reader either accept them or raise ``AdapterInvalid``, never another exception.

Each runs 2,000 cases (CI included). Inputs are mutations of valid files, structured
headers with arbitrary values, and raw bytes behind the right magic numbers.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devharness.adapters import safetensors_bytes
from loraplane.lora import AdapterInvalid, extract_archive, read_header
from loraplane.lora.safetensors import DTYPE_BITS

CASES = settings(max_examples=2000, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_INTS = st.one_of(st.integers(min_value=-2, max_value=64), st.integers(min_value=0),
                  st.sampled_from([10**200, 2**63, 2**64 - 1, 2**53 + 1]))
_JSON_SCALARS = st.one_of(st.none(), st.booleans(), _INTS, st.floats(allow_nan=False),
                          st.text(max_size=8))
_JSON = st.recursive(_JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


@st.composite
def _tensor(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(_JSON)
    entry: dict[str, Any] = {
        "dtype": draw(st.one_of(st.sampled_from(sorted(DTYPE_BITS)), st.text(max_size=5))),
        "shape": draw(st.one_of(st.lists(_INTS, max_size=5), _JSON)),
        "data_offsets": draw(st.one_of(st.lists(_INTS, min_size=2, max_size=2), _JSON)),
    }
    if draw(st.booleans()) and entry:
        entry.pop(draw(st.sampled_from(sorted(entry))))
    return entry


@st.composite
def _headers(draw: st.DrawFn) -> bytes:
    header: dict[str, Any] = draw(st.dictionaries(st.text(max_size=6), _tensor(), max_size=4))
    if draw(st.booleans()):
        header["__metadata__"] = draw(_JSON)
    data = draw(st.binary(max_size=64))
    raw = json.dumps(header).encode()
    length = draw(st.one_of(st.just(len(raw)), st.integers(0, 2**64 - 1)))
    return safetensors_bytes(raw, header_length=length, data=data)


def _valid_safetensors() -> bytes:
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
              "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}
    return safetensors_bytes(header, data=bytes(range(22)))


@st.composite
def _mutated(draw: st.DrawFn, original: bytes) -> bytes:
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.integers(0, 2))
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == 0 and data:
            data[position] = draw(st.integers(0, 255))
        elif kind == 1:
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[position:position + draw(st.integers(1, 16))]
    return bytes(data)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


@CASES
@given(content=st.one_of(_headers(), _mutated(_valid_safetensors()), st.binary(max_size=96)))
def test_safetensors_header_parses_or_refuses(scratch: Path, content: bytes) -> None:
    path = scratch / "model.safetensors"
    path.write_bytes(content)
    try:
        header = read_header(path, max_header_bytes=4096)
    except AdapterInvalid as exc:
        json.dumps(exc.to_dict())  # the refusal itself must be reportable
        return
    assert header.data_start + header.data_bytes == len(content)


def _zip(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def _tar(members: list[tuple[str, bytes]], mode: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:  # type: ignore[call-overload]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


_NAMES = st.one_of(st.sampled_from(["adapter_config.json", "adapter_model.safetensors",
                                    "dir/adapter_config.json", "../x", "/abs", "a/../b",
                                    "dir/", "."]),
                   st.text(min_size=1, max_size=12))
_MEMBERS = st.lists(st.tuples(_NAMES, st.binary(max_size=64)), min_size=1, max_size=4)


@st.composite
def _archives(draw: st.DrawFn) -> bytes:
    members = draw(_MEMBERS)
    kind = draw(st.sampled_from(["zip", "w:gz", "w:"]))
    try:
        original = _zip(members) if kind == "zip" else _tar(members, kind)
    except (ValueError, UnicodeEncodeError, IndexError):  # names the writers refuse
        original = _zip([("adapter_config.json", b"{}")])
    return draw(st.one_of(st.just(original), _mutated(original)))


_MAGIC = st.sampled_from([b"PK\x03\x04", b"PK\x05\x06", b"\x1f\x8b"])


@CASES
@given(content=st.one_of(_archives(), st.builds(bytes.__add__, _MAGIC, st.binary(max_size=96))))
def test_archive_reader_extracts_or_refuses(scratch: Path, content: bytes) -> None:
    src, dest = scratch / "upload.bin", scratch / "out"
    src.write_bytes(content)
    try:
        paths = extract_archive(src, dest, max_total_bytes=1 << 20, max_members=8,
                                max_file_bytes=1 << 19)
    except AdapterInvalid as exc:
        json.dumps(exc.to_dict())
        assert not dest.exists() or not any(dest.iterdir())
        return
    finally:
        if dest.exists():
            shutil.rmtree(dest)
    assert all(p.resolve().is_relative_to(dest.resolve()) for p in paths)
