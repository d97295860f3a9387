"""scripts/fuzz.sh must keep working: a short run of both targets in CI, a planted bug
it has to catch, and the checks it applies, each shown a broken component."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from loraplane.lora import AdapterInvalid, extract_archive, read_header
from scripts.fuzz_inputs import (
    archive_seeds,
    fix_tar_checksums,
    mutate_archive,
    mutate_safetensors,
    safetensors_seeds,
)
from scripts.fuzz_properties import PropertyViolation, check_archive, check_safetensors

REPO = Path(__file__).resolve().parents[2]
FUZZ = REPO / "scripts" / "fuzz.sh"


def _fuzz(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FUZZ), *args, "--findings", str(tmp_path), "--seed", "7"],
                          capture_output=True, text=True, cwd=REPO, timeout=600,
                          check=False)  # fmt: skip


def test_fuzz_script_runs_2000_inputs_of_each_target_without_findings(tmp_path: Path) -> None:
    result = _fuzz(tmp_path, "2000")
    assert result.returncode == 0, result.stdout + result.stderr
    for target in ("safetensors", "archive"):
        assert f"{target}: 2000 cases in " in result.stdout, result.stdout
    assert "0 findings" in result.stdout and "no findings" in result.stdout
    assert not list((tmp_path / "archive").iterdir())


def test_fuzz_script_saves_and_replays_what_it_finds(tmp_path: Path) -> None:
    result = _fuzz(tmp_path, "500", "--targets", "canary")
    assert result.returncode == 1, result.stdout + result.stderr
    crashes = list((tmp_path / "canary").glob("crash-*"))
    assert len(crashes) == 1 and "planted bug" in result.stdout, result.stdout
    replay = subprocess.run(
        [sys.executable, "-m", "scripts.fuzz_targets", "canary", str(crashes[0])],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert replay.returncode != 0 and "planted bug" in replay.stdout + replay.stderr


def test_seeds_are_valid_and_pass_every_check(tmp_path: Path) -> None:
    for data in safetensors_seeds().values():
        check_safetensors(tmp_path / "w.safetensors", data)
    for name, data in archive_seeds().items():
        src = tmp_path / f"{name}.bin"
        src.write_bytes(data)
        assert extract_archive(src, tmp_path / name, max_total_bytes=1 << 20, max_members=8,
                               max_file_bytes=1 << 20)  # fmt: skip
        check_archive(tmp_path / "case", data)


def _escaping(src: Path, dest: Path, **limits: Any) -> list[Path]:
    dest.mkdir(exist_ok=True)
    (dest.parent.parent / "escaped").write_bytes(b"x")
    return []


def _partial(src: Path, dest: Path, **limits: Any) -> list[Path]:
    dest.mkdir(exist_ok=True)
    (dest / "half.bin").write_bytes(b"x")
    raise AdapterInvalid("archive_too_large", "refused after writing")


def _linking(src: Path, dest: Path, **limits: Any) -> list[Path]:
    dest.mkdir(exist_ok=True)
    (dest / "link").symlink_to("/etc/passwd")
    return [dest / "link"]


def _crashing(src: Path, dest: Path, **limits: Any) -> list[Path]:
    raise ValueError("not the domain error")


@pytest.mark.parametrize(("extract", "error"), [
    (_escaping, PropertyViolation), (_partial, PropertyViolation),
    (_linking, PropertyViolation), (_crashing, ValueError),
])  # fmt: skip
def test_archive_check_catches_a_broken_extractor(tmp_path: Path, extract: Any,
                                                  error: type[Exception]) -> None:
    data = archive_seeds()["zip-top"]
    for payload in (data, data + b"\x00"):  # both target modes: existing and absent
        with pytest.raises(error):
            check_archive(tmp_path / "work" / "case", payload, extract)


def test_safetensors_check_catches_a_header_that_lies(tmp_path: Path) -> None:
    data = safetensors_seeds()["two"]

    def lying(path: Path, **kwargs: Any) -> Any:
        header = read_header(path, **kwargs)
        return type(header)(header.tensors, header.metadata, header.data_start + 1)

    with pytest.raises(PropertyViolation):
        check_safetensors(tmp_path / "w.safetensors", data, lying)


def _first_name(data: bytes) -> str:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return archive.getmembers()[0].name


def test_tar_checksums_are_fixed_after_a_byte_mutation() -> None:
    data = bytearray(archive_seeds()["tar-flat"])
    data[data.index(b"adapter_config.json")] = ord("Z")
    with pytest.raises(tarfile.ReadError):
        _first_name(bytes(data))
    assert _first_name(fix_tar_checksums(bytes(data))) == "Zdapter_config.json"


@pytest.mark.parametrize("seed", range(40))
def test_mutators_respect_the_size_limit(seed: int) -> None:
    def flip(data: bytes, max_size: int) -> bytes:
        return (bytes([data[0] ^ 1]) + data[1:])[:max_size] if data else b"\x00"

    # libFuzzer stops the whole run on a mutation longer than max_size.
    for data in archive_seeds().values():
        for limit in (len(data), 600):
            assert len(mutate_archive(data, limit, seed, flip)) <= limit
    for data in safetensors_seeds().values():
        for limit in (len(data), 64):
            assert len(mutate_safetensors(data, limit, seed, flip)) <= limit


def _flip(data: bytes, max_size: int) -> bytes:
    return (bytes([data[0] ^ 1]) + data[1:])[:max_size] if data else b"\x00"


def test_mutators_survive_inputs_the_standard_library_chokes_on() -> None:
    # tarfile raises IndexError on a GNU sparse header whose extension block is missing;
    # a mutator that lets it through stops the whole libFuzzer run.
    info = tarfile.TarInfo("x")
    info.type = tarfile.GNUTYPE_SPARSE
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
    block[482] = 1
    truncated = fix_tar_checksums(bytes(block))
    for seed in range(64):
        for data in (truncated, gzip.compress(truncated)):
            assert len(mutate_archive(data, 4096, seed, _flip)) <= 4096
