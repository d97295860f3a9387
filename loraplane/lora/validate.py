"""Validate a PEFT LoRA adapter directory end to end.

The registry calls this at upload (no base model at hand: ``base_shapes`` is
None) and the agent before loading into vLLM (with the base model's shapes
and vLLM's ``max_lora_rank``). Cheap header checks run first; the full value
scan, which reads every byte in bounded chunks, runs last.
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loraplane.lora.base_model import BaseModelShapes, check_against_base
from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.peft_config import LoraConfig, parse_lora_config
from loraplane.lora.safetensors import (
    DEFAULT_MAX_HEADER_BYTES,
    check_float_dtypes,
    read_header,
    scan_finite,
)
from loraplane.lora.tensors import check_tensors

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ALLOWED_FILES = (CONFIG_FILE, WEIGHTS_FILE)
_PICKLE_FILES = frozenset({"adapter_model.bin", "adapter_model.pt", "pytorch_model.bin"})


@dataclass(frozen=True)
class AdapterSummary:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    base_model: str | None
    files: tuple[str, ...]
    layers: tuple[int, ...] = ()
    dtypes: tuple[str, ...] = ()
    num_tensors: int = 0
    use_rslora: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for version metadata and events."""
        data = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


def validate_adapter_dir(
    directory: str | os.PathLike[str],
    *,
    expected_base_model: str | None = None,
    max_rank: int | None = None,
    base_shapes: BaseModelShapes | None = None,
    check_values: bool = True,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
) -> AdapterSummary:
    """Check every rule an adapter must meet; raise :class:`AdapterInvalid` otherwise.

    ``expected_base_model`` must equal the config's ``base_model_name_or_path``
    (trailing slashes aside); ``max_rank`` is vLLM's ``max_lora_rank``.
    """
    directory = Path(directory)
    files = _list_files(directory)
    config = parse_lora_config(directory / CONFIG_FILE)
    _check_base_model(config, expected_base_model)
    weights = directory / WEIGHTS_FILE
    header = read_header(weights, max_header_bytes=max_header_bytes)
    summary = check_tensors(header, config)
    # vLLM checks the config's ranks (r and rank_pattern) against
    # max_lora_rank; the tensors' own ranks were matched to them above.
    rank = max(summary.rank, config.max_rank)
    _check_rank(rank, max_rank)
    check_float_dtypes(header)
    if base_shapes is not None:
        check_against_base(summary, base_shapes)
    if check_values:
        scan_finite(weights, header)
    return AdapterSummary(
        rank=rank,
        alpha=config.lora_alpha,
        target_modules=summary.target_modules,
        base_model=config.base_model_name_or_path,
        files=files,
        layers=summary.layers,
        dtypes=summary.dtypes,
        num_tensors=len(header.tensors),
        use_rslora=config.use_rslora,
    )


def _check_rank(rank: int, max_rank: int | None) -> None:
    if max_rank is not None and rank > max_rank:
        raise AdapterInvalid(
            "rank_too_large",
            f"adapter rank {rank} is above the maximum {max_rank}",
            {"rank": rank, "max_rank": max_rank},
        )


def _list_files(directory: Path) -> tuple[str, ...]:
    present: list[str] = []
    unknown: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if entry.name in ALLOWED_FILES and stat.S_ISREG(mode):
                present.append(entry.name)
            else:
                unknown.append(entry.name + ("/" if stat.S_ISDIR(mode) else ""))
    if unknown:
        raise AdapterInvalid(
            "unknown_file",
            _unknown_message(sorted(unknown)),
            {"files": sorted(unknown), "allowed": list(ALLOWED_FILES)},
        )
    if CONFIG_FILE not in present:
        raise AdapterInvalid("missing_config", f"{CONFIG_FILE} is missing", {"file": CONFIG_FILE})
    if WEIGHTS_FILE not in present:
        raise AdapterInvalid(
            "missing_weights", f"{WEIGHTS_FILE} is missing", {"file": WEIGHTS_FILE}
        )
    return tuple(sorted(present))


def _unknown_message(unknown: list[str]) -> str:
    pickles = [name for name in unknown if name in _PICKLE_FILES]
    if pickles:
        # Pickle files can run code when loaded; only safetensors is accepted.
        return (
            f"{', '.join(pickles)}: pickle weights are not accepted, "
            f"save the adapter as {WEIGHTS_FILE}"
        )
    return (
        f"unexpected files {', '.join(unknown)}; an adapter holds only "
        f"{' and '.join(ALLOWED_FILES)} (as regular files)"
    )


def _check_base_model(config: LoraConfig, expected: str | None) -> None:
    if expected is None:
        return
    actual = config.base_model_name_or_path
    if actual is None or actual.rstrip("/") != expected.rstrip("/"):
        raise AdapterInvalid(
            "base_model_mismatch",
            f"adapter was trained on {actual!r}, expected {expected!r}",
            {"base_model": actual, "expected_base_model": expected},
        )
