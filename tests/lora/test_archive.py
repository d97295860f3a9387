from __future__ import annotations

import gzip
import io
import stat
import tarfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest

from devharness.adapters import make_adapter, pack_adapter
from loraplane.lora import extract_archive, validate_adapter_dir
from loraplane.lora.archive_writer import Limits as _Limits
from loraplane.lora.archive_writer import Writer as _Writer
from tests.lora.util import expect_refusal, leftovers

LIMITS: dict[str, int] = {"max_total_bytes": 4 << 20, "max_members": 16, "max_file_bytes": 2 << 20}


def _file(name: str, data: bytes = b"{}") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


def _tar(
    path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz"
) -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tf:  # type: ignore[call-overload]
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _zip(path: Path, members: list[tuple[str | zipfile.ZipInfo, bytes]]) -> Path:
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicates we write on purpose
        for name, data in members:
            zf.writestr(name, data)
    return path


def _refuse(code: str, src: Path, dest: Path, **limits: int | None) -> Any:
    error = expect_refusal(code, extract_archive, src, dest, **{**LIMITS, **limits})
    assert leftovers(dest) == []
    return error


@pytest.mark.parametrize("fmt", ["tar.gz", "tar", "zip"])
def test_extracts_a_packed_adapter(tmp_path: Path, fmt: Any) -> None:
    source = make_adapter(tmp_path / "src")
    archive = pack_adapter(source, tmp_path / f"a.{fmt}", fmt=fmt)
    dest = tmp_path / "dest"
    files = extract_archive(
        archive, dest, max_total_bytes=1 << 20, max_members=4, max_file_bytes=1 << 20
    )
    assert files == [dest / "adapter_config.json", dest / "adapter_model.safetensors"]
    for path in files:
        assert path.read_bytes() == (source / path.name).read_bytes()
        assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0
    assert leftovers(dest) == ["adapter_config.json", "adapter_model.safetensors"]
    assert validate_adapter_dir(dest).rank == 8


def test_no_top_dir_and_dot_prefixes(tmp_path: Path) -> None:
    dot = tarfile.TarInfo("./")
    dot.type = tarfile.DIRTYPE
    archive = _tar(
        tmp_path / "a.tgz", [(dot, None), _file("./adapter_config.json"), _file("./x/y.bin")]
    )
    files = extract_archive(archive, tmp_path / "d", **LIMITS)
    assert files == [tmp_path / "d" / "adapter_config.json", tmp_path / "d" / "x" / "y.bin"]


def test_strips_exactly_one_common_directory(tmp_path: Path) -> None:
    nested = _zip(
        tmp_path / "n.zip", [("top/", b""), ("top/sub/a.json", b"1"), ("top/sub/b.json", b"2")]
    )
    assert leftovers(_dest(tmp_path, "n", nested)) == ["sub", "sub/a.json", "sub/b.json"]
    two = _zip(tmp_path / "t.zip", [("one/a.json", b"1"), ("two/b.json", b"2")])
    assert leftovers(_dest(tmp_path, "t", two)) == ["one", "one/a.json", "two", "two/b.json"]


def _dest(tmp_path: Path, name: str, archive: Path) -> Path:
    extract_archive(archive, tmp_path / name, **LIMITS)
    return tmp_path / name


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "adapter/../../evil", "..", "a/b/../../../c", "C:/x", "a\\..\\b"]
)
def test_escaping_names(tmp_path: Path, name: str) -> None:
    good = _file("adapter/adapter_config.json")
    _refuse("unsafe_archive", _tar(tmp_path / "a.tgz", [good, _file(name)]), tmp_path / "d1")
    _refuse(
        "unsafe_archive",
        _zip(tmp_path / "a.zip", [("adapter/ok.json", b"1"), (name, b"x")]),
        tmp_path / "d2",
    )


@pytest.mark.parametrize(
    "member",
    [
        _special("adapter/adapter_model.safetensors", tarfile.SYMTYPE, "/etc/passwd"),
        _special(
            "adapter/adapter_model.safetensors", tarfile.LNKTYPE, "adapter/adapter_config.json"
        ),
        _special("adapter/fifo", tarfile.FIFOTYPE),
        _special("adapter/tty", tarfile.CHRTYPE),
        _special("adapter/disk", tarfile.BLKTYPE),
    ],
)
def test_links_and_devices_in_tar(tmp_path: Path, member: tuple[tarfile.TarInfo, None]) -> None:
    # A regular file first, so cleanup of already-written files is proven too.
    archive = _tar(tmp_path / "a.tgz", [_file("adapter/adapter_config.json"), member])
    dest = tmp_path / "dest"
    dest.mkdir()
    _refuse("unsafe_archive", archive, dest)
    assert dest.is_dir()  # a directory the caller made is kept, only emptied


def test_symlink_in_zip(tmp_path: Path) -> None:
    link = zipfile.ZipInfo("adapter/adapter_model.safetensors")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    archive = _zip(
        tmp_path / "a.zip", [("adapter/adapter_config.json", b"{}"), (link, b"/etc/passwd")]
    )
    _refuse("unsafe_archive", archive, tmp_path / "d")


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_truncated_gnu_sparse_header(tmp_path: Path, mode: str) -> None:
    # Found by scripts/fuzz.sh: tarfile raised IndexError on a GNU sparse header whose
    # extension block is cut off by the end of the archive.
    info = tarfile.TarInfo("adapter_config.json")
    info.type = tarfile.GNUTYPE_SPARSE
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
    block[482] = 1  # "isextended": another block of sparse entries follows
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    data = bytes(block) + b"\x00" * 12
    path = tmp_path / "a.tar"
    if mode == "w:gz":
        data = gzip.compress(data)
    path.write_bytes(data)
    error = _refuse("invalid_archive", path, tmp_path / "d")
    assert "truncated" in error.message


def test_zip_member_with_an_empty_name(tmp_path: Path) -> None:
    # Found by scripts/fuzz.sh: zipfile's is_dir() raised IndexError on an empty name.
    members: list[tuple[str | zipfile.ZipInfo, bytes]] = [
        ("adapter_config.json", b"{}"), (zipfile.ZipInfo(""), b"x")]
    archive = _zip(tmp_path / "a.zip", members)
    dest = tmp_path / "d"
    dest.mkdir()
    error = _refuse("unsafe_archive", archive, dest)
    assert "empty name" in error.message


@pytest.mark.parametrize(
    "names",
    [
        ["a/x.json", "a/x.json"],
        ["a/x.json", "a/./x.json"],
        ["a/x", "a/x/y"],
        ["a/x/y", "a/x"],
        ["a/x", "a/x/"],
    ],
)
def test_duplicate_and_conflicting_names(tmp_path: Path, names: list[str]) -> None:
    members = []
    for name in names:
        if name.endswith("/"):
            members.append(_special(name, tarfile.DIRTYPE))
        else:
            members.append(_file(name))
    _refuse("unsafe_archive", _tar(tmp_path / "a.tgz", members), tmp_path / "d1")
    if not names[1].endswith("/"):
        _refuse(
            "unsafe_archive", _zip(tmp_path / "a.zip", [(n, b"1") for n in names]), tmp_path / "d2"
        )


def test_expansion_bomb(tmp_path: Path) -> None:
    zeros = b"\0" * (16 << 20)
    tgz = _tar(
        tmp_path / "bomb.tgz",
        [_file("a/one.bin", zeros[: 3 << 20]), _file("a/two.bin", zeros[: 3 << 20])],
    )
    assert tgz.stat().st_size < 100_000
    # The ratio is off here: these are the totals' refusals (test_archive_limits.py has
    # the ratio's).
    off = {"max_expansion_ratio": None}
    error = _refuse("archive_too_large", tgz, tmp_path / "d1", max_file_bytes=8 << 20, **off)
    assert error.too_large is True
    zipped = _zip(tmp_path / "bomb.zip", [("a/big.bin", zeros)])
    _refuse("archive_too_large", zipped, tmp_path / "d2", max_file_bytes=32 << 20, **off)
    _refuse("file_too_large", zipped, tmp_path / "d3", max_total_bytes=32 << 20, **off)


def test_limits_count_bytes_actually_written(tmp_path: Path) -> None:
    # Declared sizes are only an early check; the limits are enforced on the
    # bytes the decompressor actually yields, whatever a header announced.
    limits = _Limits(max_total_bytes=100, max_members=5, max_file_bytes=50)
    writer = _Writer(tmp_path / "one", limits)
    writer.check_declared("a/x", 10)
    assert expect_refusal(
        "file_too_large", writer.add_file, "a/x", io.BytesIO(b"\0" * 51)
    ).too_large
    writer = _Writer(tmp_path / "two", limits)
    writer.add_file("a/y", io.BytesIO(b"\0" * 50))
    writer.add_file("a/z", io.BytesIO(b"\0" * 50))
    expect_refusal("archive_too_large", writer.add_file, "a/w", io.BytesIO(b"\0"))
    assert (tmp_path / "two" / "a" / "z").stat().st_size == 50


def test_too_many_members(tmp_path: Path) -> None:
    members = [_file(f"a/f{i}.json") for i in range(20)]
    _refuse("archive_too_large", _tar(tmp_path / "a.tgz", members), tmp_path / "d1")
    _refuse(
        "archive_too_large",
        _zip(tmp_path / "a.zip", [(f"a/f{i}", b"1") for i in range(20)]),
        tmp_path / "d2",
    )


def test_oversized_tar_metadata_record(tmp_path: Path) -> None:
    info, data = _file("a/adapter_config.json")
    info.pax_headers = {"comment": "x" * (2 << 20)}
    _refuse("archive_too_large", _tar(tmp_path / "pax.tgz", [(info, data)]), tmp_path / "d")


def test_not_an_archive(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"this is not an archive" * 100)
    _refuse("invalid_archive", junk, tmp_path / "d1")
    gz_of_junk = tmp_path / "junk2.tgz"
    import gzip

    gz_of_junk.write_bytes(gzip.compress(b"not a tar" * 1000))
    _refuse("invalid_archive", gz_of_junk, tmp_path / "d2")


def test_truncated_archives(tmp_path: Path) -> None:
    source = make_adapter(tmp_path / "src", hidden=512)
    for fmt in ("tar.gz", "zip"):
        archive = pack_adapter(source, tmp_path / f"a.{fmt}", fmt=fmt)
        archive.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
        _refuse("invalid_archive", archive, tmp_path / f"d-{fmt}", max_file_bytes=4 << 20)


def test_corrupt_and_encrypted_zip(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("a/x.json", b"A" * 1000)
    raw = bytearray(archive.read_bytes())
    raw[500] ^= 0xFF  # inside the stored data: CRC check fails
    archive.write_bytes(bytes(raw))
    _refuse("invalid_archive", archive, tmp_path / "d1")
    raw[500] ^= 0xFF
    central = raw.index(b"PK\x01\x02")
    raw[central + 8] |= 0x1  # general purpose flag: encrypted
    archive.write_bytes(bytes(raw))
    error = _refuse("invalid_archive", archive, tmp_path / "d2")
    assert "encrypted" in error.message


def test_destination_must_be_empty(tmp_path: Path) -> None:
    archive = pack_adapter(make_adapter(tmp_path / "src"), tmp_path / "a.tgz")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        extract_archive(archive, dest, **LIMITS)
    assert leftovers(dest) == ["keep"]
