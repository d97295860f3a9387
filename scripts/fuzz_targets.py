"""One fuzz target under atheris (libFuzzer): ``python -m scripts.fuzz_targets TARGET ARGS``.

ARGS are libFuzzer's (``-runs=N``, corpus folders, or files to replay one by one).
scripts/fuzz.sh runs this once per target; run it by hand to replay a finding:
``.venv/bin/python -m scripts.fuzz_targets archive fuzz-findings/archive/crash-...``.

Targets: ``safetensors`` (the header parser, then the NaN/Inf scan on what it
accepts), ``archive`` (zip, tar.gz and tar extraction), and ``canary``: the
safetensors check around a parser with a planted bug, which the harness must catch.
Any exception other than the domain error ``AdapterInvalid`` is a finding; so is
memory past the address-space cap (a ``MemoryError``) or libFuzzer's RSS limit.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris

TARGETS = ("safetensors", "archive", "canary")


def _cap_memory() -> None:
    # A hard cap on address space: a parser that tries to allocate without bound
    # gets a MemoryError (a finding) instead of taking the machine down.
    limit = int(os.environ.get("LORAPLANE_FUZZ_MEMORY_MB", "3072")) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _planted_bug(reader: Callable[..., Any]) -> Callable[..., Any]:
    def parse(path: Path, **kwargs: Any) -> Any:
        header = reader(path, **kwargs)
        if header.tensors:
            raise KeyError("planted bug: the canary target fails on any tensor")
        return header

    return parse


def _target(name: str, work: Path) -> tuple[Callable[[bytes], None], Callable[..., bytes]]:
    # Imported here, inside the hook, so that coverage guides the mutations through the
    # parsers and the standard library's archive readers.
    with atheris.instrument_imports(include=["loraplane", "tarfile", "zipfile", "gzip"]):
        from loraplane.lora import read_header  # noqa: PLC0415
        from scripts import fuzz_properties as props  # noqa: PLC0415
    from scripts import fuzz_inputs  # noqa: PLC0415

    weights = work / "model.safetensors"
    if name == "archive":
        return lambda data: props.check_archive(work / "case", data), fuzz_inputs.mutate_archive
    reader = _planted_bug(read_header) if name == "canary" else read_header
    return (lambda data: props.check_safetensors(weights, data, reader),
            fuzz_inputs.mutate_safetensors)  # fmt: skip


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(f"usage: python -m scripts.fuzz_targets {{{','.join(TARGETS)}}} [libFuzzer args]")
    _cap_memory()
    work = Path(tempfile.mkdtemp(prefix=f"loraplane-fuzz-{argv[1]}-")).resolve()
    check, mutator = _target(argv[1], work)

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        return mutator(data, max_size, seed, atheris.Mutate)

    atheris.Setup([argv[0], *argv[2:]], check, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
