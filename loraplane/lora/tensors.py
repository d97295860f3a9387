"""Cross-check the tensors of a PEFT LoRA checkpoint against its config.

PEFT saves a LoRA on module ``M`` as ``base_model.model.M.lora_A.weight``
(shape ``[r, in_features]``) and ``base_model.model.M.lora_B.weight``
(shape ``[out_features, r]``). Anything else in the file is either a feature
vLLM does not serve or a sign of a broken export, so it is refused.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, NoReturn

from loraplane.lora.errors import AdapterInvalid
from loraplane.lora.patterns import (
    MAX_MODULE_CHARS,
    compile_pattern,
    is_printable_ascii,
    layers_pattern_source,
)
from loraplane.lora.peft_config import LoraConfig
from loraplane.lora.safetensors import SafetensorsHeader, TensorInfo

PEFT_PREFIX = "base_model.model."
_SUFFIXES = {".lora_A.weight": "A", ".lora_B.weight": "B"}
_EMBEDDING_SUFFIXES = (".lora_embedding_A", ".lora_embedding_B")
# PEFT's default: the first ".<name>.<digits>." group is the layer index.
_DEFAULT_LAYER = re.compile(r".*?\.[^.]*\.(?P<idx>\d+)\.")


@dataclass(frozen=True)
class LoraModule:
    path: str
    short_name: str
    layer: int | None
    rank: int
    in_features: int
    out_features: int


@dataclass(frozen=True)
class TensorSummary:
    rank: int
    target_modules: tuple[str, ...]
    layers: tuple[int, ...]
    modules: dict[str, LoraModule]
    dtypes: tuple[str, ...]

    @property
    def features(self) -> dict[str, tuple[int, int]]:
        """Module path -> (in_features, out_features)."""
        return {p: (m.in_features, m.out_features) for p, m in self.modules.items()}


def _mismatch(message: str, **detail: Any) -> NoReturn:
    raise AdapterInvalid("tensor_mismatch", message, detail)


def layer_index(module: str, layers_pattern: tuple[str, ...] | None = None) -> int | None:
    """The transformer layer a module path belongs to, found as PEFT does."""
    if not layers_pattern:
        match = _DEFAULT_LAYER.match(module)
    else:
        # Patterns from the config: matched with RE2, in linear time.
        for pattern in layers_pattern:
            found = compile_pattern(layers_pattern_source(pattern)).match_group(module, "idx")
            if found is not None:
                return int(found)
        return None
    return int(match.group("idx")) if match else None


def check_tensors(header: SafetensorsHeader, config: LoraConfig) -> TensorSummary:
    """Pair lora_A/lora_B tensors per module and check them against ``config``.

    Raises :class:`AdapterInvalid` with ``tensor_mismatch``.
    """
    pairs = _pair_tensors(header)
    if not pairs:
        _mismatch("the safetensors file holds no LoRA tensors")
    config.check_pattern_work(pairs.keys())
    modules: dict[str, LoraModule] = {}
    for path in sorted(pairs):
        _check_targeted(path, config)
        modules[path] = _check_pair(path, pairs[path], config)
    layers = {m.layer for m in modules.values() if m.layer is not None}
    return TensorSummary(
        rank=max(m.rank for m in modules.values()),
        target_modules=tuple(sorted({m.short_name for m in modules.values()})),
        layers=tuple(sorted(layers)),
        modules=modules,
        dtypes=tuple(sorted({t.dtype for t in header.tensors.values()})),
    )


def header_features(header: SafetensorsHeader) -> dict[str, tuple[int, int]]:
    """Module path -> (in_features, out_features) of a checked header, config unread:
    lora_A is [r, in] and lora_B is [out, r]. Raises ``tensor_mismatch`` like
    :func:`check_tensors` on a header it would refuse."""
    features = {}
    for path, pair in _pair_tensors(header).items():
        a, b = pair["A"].shape, pair["B"].shape
        if len(a) != 2 or len(b) != 2:
            _mismatch(f"module {path!r}: lora_A and lora_B must be matrices", module=path)
        features[path] = (a[1], b[0])
    return features


def _module_of(name: str) -> tuple[str, str]:
    if name.endswith(_EMBEDDING_SUFFIXES):
        _mismatch(f"tensor {name!r} is an embedding LoRA, which is not supported", tensor=name)
    if not name.startswith(PEFT_PREFIX):
        _mismatch(f"tensor {name!r} does not start with {PEFT_PREFIX!r}", tensor=name)
    for suffix, kind in _SUFFIXES.items():
        if name.endswith(suffix):
            path = name[len(PEFT_PREFIX) : -len(suffix)]
            if not path or "" in path.split("."):
                _mismatch(f"tensor {name!r} has a malformed module path", tensor=name)
            # PyTorch module paths are ASCII identifiers and indices. Long or odd ones
            # would only make the config's patterns costlier, or read differently by
            # RE2 (here) and Python's re (PEFT, vLLM): see loraplane/lora/patterns.py.
            if len(path) > MAX_MODULE_CHARS or not is_printable_ascii(path) or " " in path:
                _mismatch(
                    f"tensor {name!r}: a module path must be at most {MAX_MODULE_CHARS} "
                    "printable ASCII characters without spaces",
                    tensor=name, max_module_chars=MAX_MODULE_CHARS,
                )
            return path, kind
    _mismatch(
        f"tensor {name!r} is not a LoRA weight (expected *.lora_A.weight or *.lora_B.weight)",
        tensor=name,
    )


def _pair_tensors(header: SafetensorsHeader) -> dict[str, dict[str, TensorInfo]]:
    pairs: dict[str, dict[str, TensorInfo]] = {}
    for name, info in header.tensors.items():
        path, kind = _module_of(name)
        pairs.setdefault(path, {})[kind] = info
    for path, pair in pairs.items():
        for kind, other in (("A", "B"), ("B", "A")):
            if kind not in pair:
                _mismatch(
                    f"module {path!r} has lora_{other} but no lora_{kind}",
                    module=path,
                    missing=f"lora_{kind}",
                )
    return pairs


def _matches(spec: tuple[str, ...] | str, path: str) -> bool:
    if isinstance(spec, str):
        return compile_pattern(spec).fullmatch(path)
    # PEFT: the path is a name of the list, or ends with "." and one of them; looked up
    # per dot-bounded suffix, so a long list costs no more than a short one.
    names = _name_set(spec)
    return path in names or any(
        path[i + 1 :] in names for i, char in enumerate(path) if char == "."
    )


@functools.lru_cache(maxsize=64)
def _name_set(spec: tuple[str, ...]) -> frozenset[str]:
    return frozenset(spec)


def _check_targeted(path: str, config: LoraConfig) -> None:
    # Mirrors PEFT's check_target_module_exists, so a tensor PEFT itself
    # would never have created is treated as foreign.
    if config.exclude_modules is not None and _matches(config.exclude_modules, path):
        _mismatch(f"module {path!r} is listed in exclude_modules", module=path)
    if not _matches(config.target_modules, path):
        _mismatch(
            f"module {path!r} is not matched by target_modules",
            module=path,
            target_modules=_spec_detail(config.target_modules),
        )
    wanted = config.layers_to_transform
    if wanted is not None and not isinstance(config.target_modules, str):
        layer = layer_index(path, config.layers_pattern)
        if layer is None or layer not in wanted:
            _mismatch(
                f"module {path!r} is outside layers_to_transform",
                module=path,
                layers_to_transform=list(wanted),
            )


def _spec_detail(spec: tuple[str, ...] | str) -> list[str] | str:
    return spec if isinstance(spec, str) else list(spec)


def _check_pair(path: str, pair: dict[str, TensorInfo], config: LoraConfig) -> LoraModule:
    a, b = pair["A"], pair["B"]
    for info in (a, b):
        if len(info.shape) != 2 or 0 in info.shape:
            _mismatch(
                f"tensor {info.name!r} must be a non-empty matrix, has shape {list(info.shape)}",
                tensor=info.name,
                shape=list(info.shape),
            )
    rank = config.rank_for(path)
    (rank_a, in_features), (out_features, rank_b) = a.shape, b.shape
    if rank_a != rank or rank_b != rank:
        _mismatch(
            f"module {path!r}: lora_A is {list(a.shape)} and lora_B is {list(b.shape)}, "
            f"but the config gives rank {rank} (lora_A is [r, in], lora_B is [out, r])",
            module=path,
            rank=rank,
            lora_A=list(a.shape),
            lora_B=list(b.shape),
        )
    return LoraModule(
        path=path,
        short_name=path.rsplit(".", 1)[-1],
        layer=layer_index(path, config.layers_pattern),
        rank=rank,
        in_features=in_features,
        out_features=out_features,
    )
