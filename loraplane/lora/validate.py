"""Validate a PEFT LoRA adapter directory end to end.

The registry calls this at upload (with the base model's shapes when its
operator configured them, see ``base_model_configs``) and the agent before
loading into vLLM (with the base model's shapes and vLLM's ``max_lora_rank``).
Cheap header checks run first; the full value scan, which reads every byte in
bounded chunks, runs last.

Whether an adapter belongs to a base model is judged by its tensors' shapes,
not by the ``base_model_name_or_path`` string PEFT's ``save_pretrained``
writes: that string is often the local path the base was loaded from, or
null, or a hub id other than the name the base is served under.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loraplane.lora.base_model import BaseModelShapes, check_against_base
from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.files import (
    ALLOWED_FILES,
    CONFIG_FILE,
    IGNORED_FILES,
    WEIGHTS_FILE,
    check_names,
    list_adapter_files,
)
from loraplane.lora.peft_config import LoraConfig, parse_lora_config
from loraplane.lora.safetensors import (
    DEFAULT_MAX_HEADER_BYTES,
    SafetensorsHeader,
    check_float_dtypes,
    read_header,
    scan_finite,
)
from loraplane.lora.safetensors_stream import SafetensorsStream
from loraplane.lora.tensors import check_tensors

# A hub id ("name" or "org/name"); anything else in base_model_name_or_path is a path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


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
    # What was accepted without a full check: the publisher should look at these.
    warnings: tuple[str, ...] = ()
    # Checks worth telling the publisher about that passed (not warnings).
    notes: tuple[str, ...] = ()
    # Module path -> (in_features, out_features): the base-model-facing shapes.
    features: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for version metadata and events."""
        data = asdict(self)
        data.pop("features")  # per module: large, and kept for upload-time checks only
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

    ``expected_base_model`` is the base model the adapter is registered for;
    see :func:`_check_base_model` for how the config's ``base_model_name_or_path``
    is weighed against it. ``max_rank`` is vLLM's ``max_lora_rank``.
    """
    directory = Path(directory)
    files = list_adapter_files(directory)
    weights = directory / WEIGHTS_FILE

    def scan(header: SafetensorsHeader) -> None:
        if check_values:
            scan_finite(weights, header)

    return _validate(directory / CONFIG_FILE, files,
                     lambda: read_header(weights, max_header_bytes=max_header_bytes), scan,
                     expected_base_model=expected_base_model, max_rank=max_rank,
                     base_shapes=base_shapes)


def validate_streamed_adapter(
    config_path: Path,
    names: Iterable[str],
    weights: SafetensorsStream,
    *,
    expected_base_model: str | None = None,
    base_shapes: BaseModelShapes | None = None,
) -> AdapterSummary:
    """The checks of :func:`validate_adapter_dir`, in the same order, for an upload whose
    weights were checked while they streamed past (``weights``) and never stored here."""
    present = [n for n in names if n not in IGNORED_FILES]
    files = check_names(sorted(n for n in present if n in ALLOWED_FILES),
                         sorted(n for n in present if n not in ALLOWED_FILES))
    return _validate(config_path, files, weights.header, weights.raise_scan_error,
                     expected_base_model=expected_base_model, base_shapes=base_shapes)


def _validate(
    config_path: Path,
    files: tuple[str, ...],
    header_of: Callable[[], SafetensorsHeader],
    scan: Callable[[SafetensorsHeader], None],
    *,
    expected_base_model: str | None,
    base_shapes: BaseModelShapes | None,
    max_rank: int | None = None,
) -> AdapterSummary:
    """Cheap checks first; ``scan`` (every value) last."""
    config = parse_lora_config(config_path)
    warnings = _check_base_model(config, expected_base_model, base_shapes)
    header = header_of()
    summary = check_tensors(header, config)
    # vLLM checks the config's ranks (r and rank_pattern) against
    # max_lora_rank; the tensors' own ranks were matched to them above.
    rank = max(summary.rank, config.max_rank)
    _check_rank(rank, max_rank)
    check_float_dtypes(header)
    if base_shapes is not None:
        check_against_base(summary, base_shapes, base_model=expected_base_model)
    scan(header)
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
        warnings=warnings,
        notes=_base_model_note(config, expected_base_model, base_shapes),
        features=summary.features,
    )


def _check_rank(rank: int, max_rank: int | None) -> None:
    if max_rank is not None and rank > max_rank:
        raise AdapterInvalid(
            "rank_too_large",
            f"adapter rank {rank} is above the maximum {max_rank}",
            {"rank": rank, "max_rank": max_rank},
        )


def is_local_path(name: str | None) -> bool:
    """Whether ``base_model_name_or_path`` is a path rather than a model's name."""
    return name is not None and _HUB_ID.fullmatch(name) is None


def _check_base_model(
    config: LoraConfig, expected: str | None, shapes: BaseModelShapes | None
) -> tuple[str, ...]:
    """Weigh the config's base model string; return warnings, or refuse.

    The string decides nothing when it names the registered base model. When
    the base model's shapes are known they decide (checked later), whatever the
    string says. Without them, a null or a local path is accepted (the agent
    checks the shapes before loading); only a different model *name* is refused.
    """
    actual = config.base_model_name_or_path
    shown = _other_base_model(actual, expected)
    if shown is None or shapes is not None:
        return ()  # with shapes, the shape check decides (see _base_model_note)
    if actual is None or is_local_path(actual):
        return (f"adapter_config.json names {shown}; accepted for {expected!r} without a "
                "shape check here (the inference agent checks shapes before loading)",)
    raise AdapterInvalid(
        "base_model_mismatch",
        f"adapter was trained on {actual!r}, but this adapter is registered for base model "
        f"{expected!r}. If it really is another model, create an adapter with "
        f"--base-model {actual}; if it is the same model under another name, the registry "
        "operator can set LORAPLANE_BASE_MODEL_CONFIGS so uploads are judged by tensor shapes",
        {"base_model": actual, "expected_base_model": expected},
    )


def _other_base_model(actual: str | None, expected: str | None) -> str | None:
    """How to name the config's base model when it is not the registered one, else None."""
    if expected is None or (actual is not None and actual.rstrip("/") == expected.rstrip("/")):
        return None
    return "no base model" if actual is None else f"base model {actual!r}"


def _base_model_note(
    config: LoraConfig, expected: str | None, shapes: BaseModelShapes | None
) -> tuple[str, ...]:
    """The passed shape check that overruled the config's base model string, if any."""
    shown = _other_base_model(config.base_model_name_or_path, expected)
    if shown is None or shapes is None:
        return ()
    return (f"adapter_config.json names {shown}; the tensors' shapes were checked "
            f"against {expected!r} and fit",)
