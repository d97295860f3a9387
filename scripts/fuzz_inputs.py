"""Seed inputs, dictionaries and structure-aware mutators for scripts/fuzz.sh.

Byte mutations alone rarely get past a safetensors length prefix or a tar header
checksum, so each mutator sometimes works one layer down: it edits the header JSON
and fixes the length, edits tar members and recomputes checksums, or edits the tar
inside a gzip stream and compresses it again. ``mutate`` is libFuzzer's own byte
mutator (``atheris.Mutate``), passed in so this module imports without atheris.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from random import Random
from typing import Any

from devharness.adapters import make_adapter, pack_adapter, safetensors_bytes

Mutate = Callable[[bytes, int], bytes]

_NUMBERS: list[Any] = [0, 1, -1, 2, 7, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64,
                       10**20, 10**200, 0.5, 1e308, "1", None, True, [], {}, [1, 2], [[1]]]
_DTYPES = ["F32", "BF16", "F16", "F64", "I8", "U64", "BOOL", "F4", "F6_E2M3", "f32", ""]
_NAMES = ["../evil", "/abs/evil", "a/../../evil", "C:evil", "a\\b", "a\x00b", "x\x7f",
          ".", "./", "", "dir/", "adapter_config.json/x", "adapter/../..", "é.json",
          "a/" * 40 + "f", "x" * 300, "adapter/adapter_config.json"]
_TAR_TYPES = [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE,
              tarfile.FIFOTYPE, tarfile.CONTTYPE, tarfile.GNUTYPE_SPARSE, tarfile.DIRTYPE,
              b"x", b"g", b"L", b"K", b"9"]


def safetensors_seeds() -> dict[str, bytes]:
    """Valid files: hand-made ones and a tiny PEFT adapter in two dtypes."""
    seeds = {
        "empty": safetensors_bytes({}),
        "metadata": safetensors_bytes({"__metadata__": {"format": "pt"}}),
        "two": safetensors_bytes(
            {"__metadata__": {"format": "pt"},
             "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
             "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}},
            data=bytes(22)),
        "zero-size": safetensors_bytes(
            {"z": {"dtype": "F16", "shape": [0, 5], "data_offsets": [0, 0]}}),
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        for dtype in ("float32", "bfloat16"):
            adapter = make_adapter(Path(folder) / dtype, rank=2, hidden=8, intermediate=16,
                                   layers=1, heads=2, kv_heads=2, dtype=dtype)  # fmt: skip
            seeds[f"lora-{dtype}"] = (adapter / "adapter_model.safetensors").read_bytes()
    return seeds


def archive_seeds() -> dict[str, bytes]:
    """A tiny valid adapter as zip, tar.gz and tar, with and without a top folder."""
    seeds: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as folder:
        adapter = make_adapter(Path(folder) / "adapter", rank=2, hidden=8, intermediate=16,
                               layers=1, heads=2, kv_heads=2)  # fmt: skip
        for fmt in ("zip", "tar.gz", "tar"):
            for top in ("adapter", None):
                path = Path(folder) / f"{fmt}-{top}.bin"
                pack_adapter(adapter, path, fmt=fmt, top_dir=top)
                seeds[f"{fmt}-{'top' if top else 'flat'}"] = path.read_bytes()
    seeds["pax.tar"] = _rebuild_tar([_tarinfo("d/" + "n" * 120, 3)], [b"abc"], tarfile.PAX_FORMAT)
    return seeds


def dictionary(target: str) -> list[bytes]:
    """Tokens libFuzzer splices into inputs (its -dict file)."""
    if target == "archive":
        return [b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"ustar\x0000", b"ustar  \x00",
                b"../", b"/", b"\x1f\x8b\x08", b"path=", b"linkpath=", b"size=",
                b"GNU.sparse.", b"././@LongLink"]  # fmt: skip
    return [json.dumps(t).encode() for t in ("dtype", "shape", "data_offsets", "__metadata__",
                                             *_DTYPES)] + [b"1e400", b"-0", b"NaN", b"[]"]


def dictionary_file(target: str, path: Path) -> Path:
    lines = ['"' + "".join(f"\\x{b:02x}" for b in token) + '"' for token in dictionary(target)]
    path.write_text("\n".join(lines) + "\n")
    return path


def mutate_safetensors(data: bytes, max_size: int, seed: int, mutate: Mutate) -> bytes:
    # libFuzzer stops the whole run on a mutation longer than max_size, or on an
    # exception from here (json.loads of deeply nested input: RecursionError).
    try:
        return _mutate_safetensors(data, max_size, Random(seed), mutate)[:max_size]
    except Exception:
        return mutate(data, max_size)[:max_size]


def _mutate_safetensors(data: bytes, max_size: int, rng: Random, mutate: Mutate) -> bytes:
    choice = rng.random()
    if len(data) < 8 or choice > 0.75:
        return mutate(data, max_size)
    length = int.from_bytes(data[:8], "little")
    end = 8 + min(length, len(data) - 8)
    header, rest = data[8:end], data[end:]
    if choice < 0.3:
        header = _mutate_header_json(header, rng)
    elif choice < 0.6:
        header = mutate(header, max(2 * len(header), 64))
    else:
        rest = mutate(rest, max(2 * len(rest), 64))
    if rng.random() < 0.85:
        length = len(header)
    return length.to_bytes(8, "little") + header + rest


def _mutate_header_json(header: bytes, rng: Random) -> bytes:
    try:
        document = json.loads(header)
    except ValueError:
        return header
    if not isinstance(document, dict) or not document:
        return json.dumps({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    key = rng.choice(sorted(document))
    entry = document[key]
    op = rng.randrange(5)
    if op == 0 or not isinstance(entry, dict):
        document[key] = rng.choice([*_NUMBERS, {"format": "pt"}])
    elif op == 1:
        entry[rng.choice(["dtype", "shape", "data_offsets", "extra"])] = rng.choice(_NUMBERS)
    elif op == 2:
        entry["dtype"] = rng.choice(_DTYPES)
    elif op == 3:
        entry["shape"] = [rng.choice(_NUMBERS[:13]) for _ in range(rng.randrange(4))]
    else:
        document[rng.choice(["", key + "x", "__metadata__"])] = dict(entry)
    return json.dumps(document).encode()


def mutate_archive(data: bytes, max_size: int, seed: int, mutate: Mutate) -> bytes:
    try:
        return _mutate_archive(data, max_size, Random(seed), mutate)[:max_size]
    except Exception:
        # The standard library's readers, used here to rebuild members, fail in ways
        # of their own on mutated input (tarfile: IndexError), and an exception from a
        # mutator ends the whole run: judging them is the target's job, not this one's.
        return mutate(data, max_size)[:max_size]


def _mutate_archive(data: bytes, max_size: int, rng: Random, mutate: Mutate) -> bytes:
    if data[:2] == b"\x1f\x8b" and rng.random() < 0.6:
        inner = _gunzip(data)
        if inner is not None:
            changed = _mutate_tar(inner, rng, mutate, max_size)
            return gzip.compress(changed, compresslevel=rng.choice([0, 1, 9]), mtime=0)
    if data[257:262] == b"ustar":
        return _mutate_tar(data, rng, mutate, max_size)
    if data[:4] == b"PK\x03\x04" and rng.random() < 0.3:
        return _mutate_zip_members(data, rng) or mutate(data, max_size)
    return mutate(data, max_size)


def _gunzip(data: bytes) -> bytes | None:
    try:
        return zlib.decompressobj(wbits=31).decompress(data, 1 << 20)
    except zlib.error:
        return None


def _mutate_tar(data: bytes, rng: Random, mutate: Mutate, max_size: int) -> bytes:
    if rng.random() < 0.4:
        rebuilt = _mutate_tar_members(data, rng)
        if rebuilt is not None:
            return rebuilt
    return fix_tar_checksums(mutate(data, max_size))


def fix_tar_checksums(data: bytes) -> bytes:
    """Recompute the checksum of every block that looks like a ustar header."""
    buffer = bytearray(data)
    for offset in range(0, len(buffer) - 511, 512):
        block = buffer[offset:offset + 512]
        if block[257:262] == b"ustar":
            block[148:156] = b" " * 8
            buffer[offset + 148:offset + 156] = b"%06o\x00 " % sum(block)
    return bytes(buffer)


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def _rebuild_tar(infos: list[tarfile.TarInfo], payloads: list[bytes], fmt: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for info, payload in zip(infos, payloads, strict=True):
            archive.addfile(info, io.BytesIO(payload) if info.isreg() else None)
    return buffer.getvalue()


def _mutate_tar_members(data: bytes, rng: Random) -> bytes | None:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            infos = archive.getmembers()[:32]
            payloads = [(archive.extractfile(i) or io.BytesIO()).read() if i.isreg() else b""
                        for i in infos]  # fmt: skip
        if not infos:
            return None
        info = rng.choice(infos)
        op = rng.randrange(5)
        if op == 0:
            info.name = rng.choice(_NAMES)
        elif op == 1:
            info.type, info.linkname = rng.choice(_TAR_TYPES), rng.choice(_NAMES)
        elif op == 2:
            info.mode = rng.choice([0o4755, 0o2777, 0o777, 0o000, 0o7777])
        elif op == 3:
            infos.append(info.replace())
            payloads.append(payloads[infos.index(info)])
        else:
            info.pax_headers = {rng.choice(["path", "size", "linkpath", "uid"]): "x" * 200}
        fmt = rng.choice([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
        return _rebuild_tar(infos, payloads, fmt)
    except (tarfile.TarError, ValueError, OSError, EOFError, zlib.error, UnicodeError):
        return None


def _mutate_zip_members(data: bytes, rng: Random) -> bytes | None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = [(info, archive.read(info)) for info in archive.infolist()[:32]]
        if not members:
            return None
        info, _ = rng.choice(members)
        op = rng.randrange(4)
        if op == 0:
            info.filename = rng.choice(_NAMES)
        elif op == 1:
            info.external_attr = rng.choice([0o120777, 0o020644, 0o010644, 0o104755]) << 16
        elif op == 2:
            info.compress_type = rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_BZIP2])
        else:
            members.append((info, b"\x00" * rng.choice([0, 1, 100_000])))
        buffer = io.BytesIO()
        # Duplicate names are one of the mutations; zipfile warns about each.
        with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w") as out:
            warnings.simplefilter("ignore")
            for member, payload in members:
                out.writestr(member, payload)
        return buffer.getvalue()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, zlib.error, UnicodeError,
            NotImplementedError, RuntimeError):  # fmt: skip
        return None
