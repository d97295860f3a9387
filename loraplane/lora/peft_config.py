"""Strict parsing of a PEFT ``adapter_config.json`` for a plain LoRA adapter.

Only what vLLM can serve faithfully is accepted: features that change the
adapter's maths in ways vLLM does not implement (DoRA, LoRA bias, extra
trainable modules, base-weight-modifying inits, ...) are refused here rather
than discovered as a wrong answer in production.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.patterns import (
    PatternError,
    compile_pattern,
    key_paths,
    layers_pattern_source,
    rank_key_source,
)

MAX_CONFIG_BYTES = 1024 * 1024
# lora_alpha and alpha_pattern's values: the scaling is alpha / r, and a value past these
# (1e308, 1e-300) only overflows or vanishes in the served weights.
MIN_ALPHA = 1e-6
MAX_ALPHA = 1e6
# Keys in one rank_pattern or alpha_pattern, and layers_pattern entries.
MAX_PATTERN_KEYS = 4096
MAX_LAYERS_PATTERNS = 64
# Every module is tried against every rank/alpha key, here and in vLLM (which uses
# Python's backtracking re, see loraplane/lora/patterns.py): bounds on the count of
# those matches, and on the paths a backtracking matcher could take for all of them.
MAX_PATTERN_MATCHES = 1 << 19
MAX_PATTERN_PATHS = 1 << 24

# init_lora_weights values that only pick the starting weights; the others
# (pissa, olora, corda, loftq) also rewrite the base model, which vLLM can't.
_PLAIN_INITS = frozenset({"gaussian", "eva", "orthogonal", "mica", "lora_ga"})

# Fields whose mere presence (truthy) means a feature vLLM does not serve.
_UNSUPPORTED_FLAGS: dict[str, str] = {
    "use_dora": "DoRA (use_dora) is not supported by vLLM",
    "lora_bias": "LoRA bias (lora_bias) is not supported by vLLM",
    "modules_to_save": "modules_to_save (fully trained extra modules) is not supported by vLLM",
    "layer_replication": "layer_replication is not supported by vLLM",
    "use_qalora": "QALoRA (use_qalora) is not supported by vLLM",
    "use_bdlora": "block-diagonal LoRA (use_bdlora) is not supported by vLLM",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens) is not supported",
    "trainable_token_indices": "trainable_token_indices is not supported by vLLM",
    "target_parameters": "target_parameters (parameter-level LoRA) is not supported",
}


@dataclass(frozen=True)
class LoraConfig:
    r: int
    lora_alpha: float
    target_modules: tuple[str, ...] | str
    base_model_name_or_path: str | None = None
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    fan_in_fan_out: bool = False
    bias: str = "none"
    modules_to_save: tuple[str, ...] = ()
    use_rslora: bool = False
    exclude_modules: tuple[str, ...] | str | None = None
    layers_to_transform: tuple[int, ...] | None = None
    layers_pattern: tuple[str, ...] | None = None
    task_type: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def rank_for(self, module: str) -> int:
        """Rank PEFT gives ``module`` (path without ``base_model.model.``)."""
        key = _pattern_key(self.rank_pattern, module)
        return self.r if key is None else self.rank_pattern[key]

    def alpha_for(self, module: str) -> float:
        key = _pattern_key(self.alpha_pattern, module)
        return self.lora_alpha if key is None else self.alpha_pattern[key]

    def scaling_for(self, module: str) -> float:
        rank, alpha = self.rank_for(module), self.alpha_for(module)
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank

    @property
    def max_rank(self) -> int:
        return max([self.r, *self.rank_pattern.values()])

    def check_pattern_work(self, modules: Collection[str]) -> None:
        """Refuse when matching ``modules`` against the rank/alpha keys is too much work.

        vLLM matches every module against both ``rank_pattern`` and ``alpha_pattern``.
        """
        keys = [*self.rank_pattern, *self.alpha_pattern]
        if not keys or not modules:
            return
        matches = len(modules) * len(keys)
        # (.*\.)? in front of each key enters it once per dot of the name, and at its start.
        entries = max(m.count(".") for m in modules) + 1
        paths = len(modules) * entries * sum(key_paths(k) for k in keys)
        if matches > MAX_PATTERN_MATCHES or paths > MAX_PATTERN_PATHS:
            _invalid(
                f"rank_pattern and alpha_pattern have {len(keys)} keys for {len(modules)} "
                f"modules: matching them is too much work (at most {MAX_PATTERN_MATCHES} "
                "key/module pairs); use fewer or simpler keys",
                field="rank_pattern" if self.rank_pattern else "alpha_pattern",
                pattern_matches=matches,
                max_pattern_matches=MAX_PATTERN_MATCHES,
                pattern_paths=paths,
                max_pattern_paths=MAX_PATTERN_PATHS,
            )


def _pattern_key(patterns: dict[str, Any], module: str) -> str | None:
    # Same rule as PEFT's get_pattern_key and vLLM's PEFTHelper,
    # re.match(rf"(.*\.)?({key})$", module): a key matches a dot-bounded suffix of the
    # module name; the first match wins. Matched with RE2, in linear time.
    for key in patterns:
        if compile_pattern(rank_key_source(key)).match(module):
            return key
    return None


def _invalid(message: str, **detail: Any) -> NoReturn:
    raise AdapterInvalid("invalid_config", message, detail)


def parse_lora_config(
    source: str | os.PathLike[str] | bytes, *, max_bytes: int = MAX_CONFIG_BYTES
) -> LoraConfig:
    """Parse ``adapter_config.json`` from a path or its raw bytes.

    Raises :class:`AdapterInvalid`: ``missing_config`` (no such file),
    ``file_too_large`` (over ``max_bytes``) or ``invalid_config``.
    """
    document = _load_document(source, max_bytes)
    if document.get("peft_type") != "LORA":
        _invalid(
            f'peft_type must be "LORA", got {document.get("peft_type")!r}',
            field="peft_type",
        )
    _refuse_unsupported(document)
    rank_pattern = _parse_patterns(document, "rank_pattern", _positive_int)
    alpha_pattern = _parse_patterns(document, "alpha_pattern", _alpha)
    return LoraConfig(
        r=_positive_int(document.get("r"), "r"),
        lora_alpha=_alpha(document.get("lora_alpha"), "lora_alpha"),
        target_modules=_parse_targets(document.get("target_modules"), "target_modules"),
        base_model_name_or_path=_optional_str(document, "base_model_name_or_path"),
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        fan_in_fan_out=_flag(document, "fan_in_fan_out"),
        bias=_optional_str(document, "bias") or "none",
        use_rslora=_flag(document, "use_rslora"),
        exclude_modules=_parse_exclude(document.get("exclude_modules")),
        layers_to_transform=_parse_layers(document.get("layers_to_transform")),
        layers_pattern=_parse_layers_pattern(document.get("layers_pattern")),
        task_type=_optional_str(document, "task_type"),
        raw=document,
    )


def _load_document(source: str | os.PathLike[str] | bytes, max_bytes: int) -> dict[str, Any]:
    data = source if isinstance(source, bytes) else _read_bounded(Path(source), max_bytes)
    if len(data) > max_bytes:
        raise AdapterInvalid(
            "file_too_large",
            f"adapter_config.json is {len(data)} bytes, the limit is {max_bytes}",
            {"file": "adapter_config.json", "bytes": len(data), "max_bytes": max_bytes},
        )
    try:
        document = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        _invalid("adapter_config.json is not UTF-8")
    except RecursionError:
        _invalid("adapter_config.json is nested too deeply")
    except ValueError as exc:
        _invalid(f"adapter_config.json is not valid JSON: {exc}")
    if not isinstance(document, dict):
        _invalid("adapter_config.json must hold a JSON object")
    return document


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as f:
            # One byte past the limit is enough to know it is too large.
            return f.read(max_bytes + 1)
    except FileNotFoundError:
        raise AdapterInvalid(
            "missing_config", "adapter_config.json is missing", {"file": path.name}
        ) from None
    except IsADirectoryError:
        _invalid(f"{path.name} is a directory, not a file")


def _reject_constant(token: str) -> NoReturn:
    _invalid(f"adapter_config.json contains the non-standard constant {token}")


def _refuse_unsupported(document: dict[str, Any]) -> None:
    for name, reason in _UNSUPPORTED_FLAGS.items():
        if document.get(name):
            _invalid(reason, field=name)
    bias = document.get("bias", "none")
    if bias not in (None, "none"):
        _invalid(f'bias={bias!r} is not supported: vLLM serves only bias="none"', field="bias")
    init = document.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in _PLAIN_INITS:
        _invalid(
            f"init_lora_weights={init!r} modifies the base model weights; convert the adapter "
            "to a plain LoRA first",
            field="init_lora_weights",
        )
    if not isinstance(init, bool | str | None):
        _invalid("init_lora_weights must be a boolean or a string", field="init_lora_weights")


def _positive_int(value: Any, name: str) -> int:
    if type(value) is not int or value <= 0:
        _invalid(f"{name} must be a positive integer, got {value!r}", field=name)
    return value


def _alpha(value: Any, name: str) -> float:
    if (type(value) not in (int, float) or not math.isfinite(value)
            or not MIN_ALPHA <= value <= MAX_ALPHA):
        field = name.split("[", 1)[0]
        _invalid(
            f"{name} must be a finite number from {MIN_ALPHA:g} to {MAX_ALPHA:g}, "
            f"got {value!r}",
            field=field, min=MIN_ALPHA, max=MAX_ALPHA,
        )
    result: float = value
    return result


def _optional_str(document: dict[str, Any], name: str) -> str | None:
    value = document.get(name)
    if value is not None and not isinstance(value, str):
        _invalid(f"{name} must be a string", field=name)
    return value


def _flag(document: dict[str, Any], name: str) -> bool:
    value = document.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        _invalid(f"{name} must be true or false, got {value!r}", field=name)
    return value


def _check_regex(pattern: str, name: str, shown: str | None = None) -> None:
    try:
        compile_pattern(pattern)
    except PatternError as exc:
        _invalid(f"{name} pattern {shown or pattern!r} is refused: {exc}", field=name,
                 reason="pattern_refused")


def _check_key(key: str, name: str) -> None:
    """A rank/alpha key: matched here with RE2, but by vLLM with Python's re."""
    try:
        key_paths(key)
    except PatternError as exc:
        _invalid(f"{name} key {key!r} is refused: {exc}", field=name,
                 reason="pattern_refused")
    _check_regex(rank_key_source(key), name, repr(key))


def _parse_targets(value: Any, name: str) -> tuple[str, ...] | str:
    if value is None:
        _invalid(f"{name} is missing", field=name)
    if isinstance(value, str):
        if not value:
            _invalid(f"{name} is empty", field=name)
        if value == "all-linear":
            _invalid(f'{name}="all-linear" was never resolved to module names', field=name)
        _check_regex(value, name)
        return value
    if not isinstance(value, list) or not value:
        _invalid(f"{name} must be a non-empty list of names or a regex string", field=name)
    if not all(isinstance(item, str) and item for item in value):
        _invalid(f"{name} must contain only non-empty strings", field=name)
    return tuple(sorted(set(value)))


def _parse_exclude(value: Any) -> tuple[str, ...] | str | None:
    if value is None or value == []:
        return None
    return _parse_targets(value, "exclude_modules")


def _parse_patterns(
    document: dict[str, Any], name: str, check: Callable[[Any, str], Any]
) -> dict[str, Any]:
    value = document.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        _invalid(f"{name} must be an object", field=name)
    if len(value) > MAX_PATTERN_KEYS:
        _invalid(f"{name} has {len(value)} keys, the limit is {MAX_PATTERN_KEYS}", field=name)
    for key, item in value.items():
        _check_key(key, name)
        check(item, f"{name}[{key!r}]")
    return dict(value)


def _parse_layers(value: Any) -> tuple[int, ...] | None:
    if value is None or value == []:
        return None
    items = [value] if type(value) is int else value
    if not isinstance(items, list) or not all(type(i) is int and i >= 0 for i in items):
        _invalid("layers_to_transform must be a layer index or a list of them")
    return tuple(items)


def _parse_layers_pattern(value: Any) -> tuple[str, ...] | None:
    if value is None or value in ("", []):
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        _invalid("layers_pattern must be a string or a list of strings")
    if len(items) > MAX_LAYERS_PATTERNS:
        _invalid(f"layers_pattern has more than {MAX_LAYERS_PATTERNS} entries",
                 field="layers_pattern")
    for item in items:
        _check_regex(item, "layers_pattern")
        _check_regex(layers_pattern_source(item), "layers_pattern", repr(item))
    return tuple(items)
