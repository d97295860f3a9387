"""Decompression bombs: refused by ratio and by total, from headers and while writing."""

from __future__ import annotations

import io
import struct
import tarfile
import zipfile
from pathlib import Path
from typing import IO

import pytest

from devharness.adapters import make_adapter, pack_adapter
from devharness.bombs import tar_bomb, zip_bomb
from loraplane.lora import extract_archive, validate_adapter_dir
from loraplane.lora.archive_writer import RATIO_FLOOR_BYTES
from loraplane.lora.archive_writer import Limits as _Limits
from loraplane.lora.archive_writer import Writer as _Writer
from tests.lora.util import expect_refusal, leftovers

BIG = 1 << 30
# Only the ratio can stop these bombs: the totals are far above what they expand to.
LOOSE = {"max_total_bytes": BIG, "max_members": 16, "max_file_bytes": BIG}
MIB_OF_ZEROS = b"\0" * (1 << 20)


class _Spy:
    """Records what the archive writer wrote, refused or not."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.written = 0
        original = _Writer.add_file

        def add_file(writer: _Writer, name: str, stream: IO[bytes],
                     allowance: int | None = None) -> None:
            self.calls += 1
            try:
                original(writer, name, stream, allowance)
            finally:
                self.written = writer.total_bytes

        monkeypatch.setattr(_Writer, "add_file", add_file)


@pytest.mark.parametrize("build", [zip_bomb, tar_bomb], ids=["zip", "tar.gz"])
def test_a_bomb_is_refused_from_its_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            build: object) -> None:
    assert callable(build)
    bomb: Path = build(tmp_path / "bomb")
    assert bomb.stat().st_size < 512 * 1024  # a few hundred KB for 64 MiB
    spy = _Spy(monkeypatch)
    error = expect_refusal("archive_expansion_ratio", extract_archive, bomb, tmp_path / "d",
                           **LOOSE, max_expansion_ratio=100)
    assert error.too_large and error.detail["max_expansion_ratio"] == 100
    assert spy.calls == 0  # not one byte written
    assert leftovers(tmp_path / "d") == []


def test_the_total_is_checked_from_zip_headers_before_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for i in range(3):
            zf.writestr(f"a/part{i}.bin", MIB_OF_ZEROS)
    spy = _Spy(monkeypatch)
    expect_refusal("archive_too_large", extract_archive, archive, tmp_path / "d",
                   max_total_bytes=2 << 20, max_members=16, max_file_bytes=2 << 20)
    # The third member's size is in the central directory: nothing was extracted first.
    assert spy.calls == 0


def _lie_about_size(path: Path, declared: int) -> None:
    raw = bytearray(path.read_bytes())
    local = raw.index(b"PK\x03\x04")
    central = raw.index(b"PK\x01\x02")
    struct.pack_into("<I", raw, local + 22, declared)
    struct.pack_into("<I", raw, central + 24, declared)
    path.write_bytes(bytes(raw))


def test_a_lying_zip_header_is_caught_while_extracting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = zip_bomb(tmp_path / "liar.zip")
    _lie_about_size(bomb, 1000)  # 64 MiB of data declared as 1,000 bytes
    spy = _Spy(monkeypatch)
    expect_refusal("invalid_archive", extract_archive, bomb, tmp_path / "d", **LOOSE)
    assert spy.calls == 1 and spy.written <= 1000
    assert leftovers(tmp_path / "d") == []


def test_the_writer_counts_bytes_against_the_ratio(tmp_path: Path) -> None:
    limits = _Limits(max_total_bytes=BIG, max_members=5, max_file_bytes=BIG, max_ratio=10.0)
    member = _Writer(tmp_path / "member", limits)
    too_much = io.BytesIO(b"\0" * (RATIO_FLOOR_BYTES + 1))
    # A header declared little; the stream yields more than the member may expand to.
    error = expect_refusal("archive_expansion_ratio", member.add_file, "a/x", too_much,
                           limits.expansion_allowance(1000))
    assert error.detail["member"] == "a/x"
    whole = _Writer(tmp_path / "whole", limits, allowance=2 << 20)
    whole.add_file("a/one", io.BytesIO(MIB_OF_ZEROS))
    whole.add_file("a/two", io.BytesIO(MIB_OF_ZEROS))
    expect_refusal("archive_expansion_ratio", whole.add_file, "a/three", io.BytesIO(b"\0"))


def test_tar_members_count_together_against_the_ratio(tmp_path: Path) -> None:
    # Each member alone is within the ratio's floor; together they are not.
    members = [(f"a/f{i}.bin", MIB_OF_ZEROS) for i in range(8)]
    path = tmp_path / "many.tgz"
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    expect_refusal("archive_expansion_ratio", extract_archive, path, tmp_path / "d",
                   **LOOSE, max_expansion_ratio=100)
    assert leftovers(tmp_path / "d") == []


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
@pytest.mark.parametrize("zero_b", [False, True], ids=["trained", "untrained"])
def test_real_adapters_pass_the_default_ratio(tmp_path: Path, fmt: str, zero_b: bool) -> None:
    # An untrained adapter's lora_B is all zeros: the most a real adapter compresses.
    source = make_adapter(tmp_path / "src", hidden=4096, zero_b=zero_b)
    packed = pack_adapter(source, tmp_path / f"a.{fmt}", fmt=fmt)  # type: ignore[arg-type]
    files = extract_archive(packed, tmp_path / "d", **LOOSE)
    assert sorted(p.name for p in files) == ["adapter_config.json", "adapter_model.safetensors"]
    validate_adapter_dir(tmp_path / "d", expected_base_model=None)


def test_a_ratio_below_one_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ratio"):
        extract_archive(zip_bomb(tmp_path / "a.zip", 1 << 20), tmp_path / "d", **LOOSE,
                        max_expansion_ratio=0.5)
