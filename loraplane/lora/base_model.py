"""Shapes of the LoRA-able linear layers of a Llama-style base model.

Llama, Mistral, Qwen2/3 and Gemma checkpoints share one decoder layout:
``model.layers.N.self_attn.{q,k,v,o}_proj`` and
``model.layers.N.mlp.{gate,up,down}_proj``. vLLM attaches a LoRA by exact
module path, so a path it does not know is silently ignored; checking paths
and shapes here turns that silent no-op into a refusal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.tensors import LoraModule, TensorSummary

SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"}
)
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MAX_BASE_CONFIG_BYTES = 4 * 1024 * 1024


class UnsupportedBaseModel(ValueError):
    """The base model's config is unreadable or of an architecture not handled here.

    This is an operator problem (the agent's base model), not a bad adapter,
    so it is not an :class:`AdapterInvalid`.
    """


def _positive(config: Mapping[str, Any], key: str, default: Any = None) -> int:
    value = config.get(key)
    if value is None:
        value = default
    if type(value) is not int or value <= 0:
        raise UnsupportedBaseModel(f"base model config: {key} must be a positive integer")
    return value


@dataclass(frozen=True)
class BaseModelShapes:
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int

    @classmethod
    def from_hf_config(cls, source: str | os.PathLike[str] | Mapping[str, Any]) -> BaseModelShapes:
        """Build from an HF ``config.json`` (a dict, the file, or its directory)."""
        config = source if isinstance(source, Mapping) else _load_config(Path(source))
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedBaseModel(
                f"base model type {model_type!r} is not supported; "
                f"supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
            )
        hidden = _positive(config, "hidden_size")
        heads = _positive(config, "num_attention_heads")
        if hidden % heads and config.get("head_dim") is None:
            raise UnsupportedBaseModel("hidden_size is not a multiple of num_attention_heads")
        return cls(
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=_positive(config, "intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=_positive(config, "num_key_value_heads", heads),
            head_dim=_positive(config, "head_dim", hidden // heads),
            num_hidden_layers=_positive(config, "num_hidden_layers"),
        )

    def module_features(self) -> dict[str, tuple[int, int]]:
        """Short module name -> (in_features, out_features)."""
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_key_value_heads * self.head_dim
        return {
            "q_proj": (self.hidden_size, q_out),
            "k_proj": (self.hidden_size, kv_out),
            "v_proj": (self.hidden_size, kv_out),
            "o_proj": (q_out, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }

    def module_path(self, short_name: str, layer: int) -> str:
        """The path vLLM gives ``short_name`` in decoder layer ``layer``."""
        block = "self_attn" if short_name in _ATTENTION else "mlp"
        return f"model.layers.{layer}.{block}.{short_name}"


def _load_config(path: Path) -> Mapping[str, Any]:
    if path.is_dir():
        path = path / "config.json"
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BASE_CONFIG_BYTES + 1)
    except OSError as exc:
        raise UnsupportedBaseModel(f"cannot read base model config {path}: {exc}") from exc
    if len(data) > MAX_BASE_CONFIG_BYTES:
        raise UnsupportedBaseModel(f"base model config {path} is implausibly large")
    try:
        config = json.loads(data)
    except ValueError as exc:
        raise UnsupportedBaseModel(f"base model config {path} is not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise UnsupportedBaseModel(f"base model config {path} is not a JSON object")
    return config


def check_against_base(
    summary: TensorSummary, shapes: BaseModelShapes, *, base_model: str | None = None
) -> None:
    """Refuse modules the base model lacks or whose shapes differ from it.

    Raises :class:`AdapterInvalid` with ``target_module_unknown`` or
    ``shape_mismatch``; ``base_model`` (its registered name) goes into the
    message that says how to fix it.
    """
    try:
        _check_modules(summary, shapes)
    except AdapterInvalid as exc:
        if exc.code != "shape_mismatch":
            raise
        named = "the base model" if base_model is None else f"base model {base_model!r}"
        raise AdapterInvalid(
            exc.code,
            f"{exc.message}: this adapter was trained for another model than {named}; "
            "push it to an adapter registered for the base model it was trained on",
            exc.detail,
        ) from None


def _check_modules(summary: TensorSummary, shapes: BaseModelShapes) -> None:
    features = shapes.module_features()
    for module in summary.modules.values():
        if module.short_name not in features:
            raise AdapterInvalid(
                "target_module_unknown",
                f"{shapes.model_type} has no LoRA-capable module {module.short_name!r} "
                f"(adapter module {module.path!r}); known: {', '.join(features)}",
                {"module": module.path, "known": list(features)},
            )
        expected_path = (
            None if module.layer is None else shapes.module_path(module.short_name, module.layer)
        )
        if module.path != expected_path:
            raise AdapterInvalid(
                "target_module_unknown",
                f"module path {module.path!r} does not exist in {shapes.model_type} "
                f"(expected model.layers.<n>.<self_attn|mlp>.{module.short_name})",
                {"module": module.path},
            )
        _check_module_shape(module, features[module.short_name], shapes)


def _check_module_shape(
    module: LoraModule, expected: tuple[int, int], shapes: BaseModelShapes
) -> None:
    path, layer = module.path, module.layer
    in_features, out_features = module.in_features, module.out_features
    if layer is not None and layer >= shapes.num_hidden_layers:
        raise AdapterInvalid(
            "shape_mismatch",
            f"module {path!r} is in layer {layer} but the base model has "
            f"{shapes.num_hidden_layers} layers",
            {"module": path, "layer": layer, "num_hidden_layers": shapes.num_hidden_layers},
        )
    if (in_features, out_features) != expected:
        raise AdapterInvalid(
            "shape_mismatch",
            f"module {path!r} maps {in_features} -> {out_features} features but the base "
            f"model's maps {expected[0]} -> {expected[1]}",
            {
                "module": path,
                "in_features": in_features,
                "out_features": out_features,
                "expected_in_features": expected[0],
                "expected_out_features": expected[1],
            },
        )
