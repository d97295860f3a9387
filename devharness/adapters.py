"""Build real PEFT-format LoRA adapters and HF base configs on disk, for tests.

Everything is written by hand (no torch, no safetensors package) so tests do
not share code with the reader they exercise. Tensors are generated and
written one at a time, which keeps large fixtures cheap in memory.
"""

from __future__ import annotations

import json
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

DEFAULT_BASE_MODEL = "tiny-llama"
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
ALL_MODULES = ATTENTION_MODULES + MLP_MODULES

_NUMPY_TO_SAFETENSORS = {
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "bool": "BOOL",
}
_ADAPTER_DTYPES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}

Array = npt.NDArray[Any]
TensorSpec = tuple[str, str, tuple[int, ...]]  # name, safetensors dtype, shape


def safetensors_bytes(
    header: Mapping[str, Any] | bytes, *, header_length: int | None = None, data: bytes = b""
) -> bytes:
    """Raw file bytes from a header (dict or exact JSON bytes), for crafted cases."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(raw) if header_length is None else header_length
    return length.to_bytes(8, "little") + raw + data


def _header_bytes(specs: Iterable[TensorSpec], metadata: Mapping[str, str] | None) -> bytes:
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype, shape in specs:
        itemsize = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}.get(dtype)
        if itemsize is None:
            itemsize = np.dtype(_safetensors_to_numpy(dtype)).itemsize
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    # The reference writer pads with spaces so the data starts 8-aligned.
    return raw + b" " * (-len(raw) % 8)


def _safetensors_to_numpy(dtype: str) -> str:
    for numpy_name, st_name in _NUMPY_TO_SAFETENSORS.items():
        if st_name == dtype:
            return numpy_name
    raise ValueError(f"no numpy equivalent for {dtype}")


def _write_streamed(
    path: Path,
    specs: list[TensorSpec],
    produce: Callable[[str], Array],
    metadata: Mapping[str, str] | None,
) -> Path:
    raw = _header_bytes(specs, metadata)
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name, _dtype, shape in specs:
            array = produce(name)
            if array.shape != shape:
                raise ValueError(f"{name}: produced shape {array.shape}, declared {shape}")
            little = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)
            f.write(little.tobytes())
    return path


def write_safetensors(
    path: str | Path,
    tensors: Mapping[str, Array],
    metadata: Mapping[str, str] | None = None,
    *,
    dtypes: Mapping[str, str] | None = None,
) -> Path:
    """Write ``tensors`` (in order) as safetensors.

    ``dtypes`` overrides the safetensors dtype per tensor; bf16 is given as
    uint16 bit patterns with ``dtypes={name: "BF16"}`` (see :func:`to_bf16_bits`).
    """
    overrides = dict(dtypes or {})
    specs: list[TensorSpec] = []
    for name, array in tensors.items():
        dtype = overrides.get(name) or _NUMPY_TO_SAFETENSORS[array.dtype.name]
        if dtype == "BF16" and array.dtype != np.uint16:
            raise ValueError(f"{name}: BF16 tensors must be given as uint16 bit patterns")
        specs.append((name, dtype, tuple(array.shape)))
    return _write_streamed(Path(path), specs, lambda name: tensors[name], metadata)


def to_bf16_bits(values: Array) -> npt.NDArray[np.uint16]:
    """float32 values -> bfloat16 bit patterns, rounding to nearest even."""
    as_f32 = np.asarray(values, dtype=np.float32)
    bits = as_f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    # Rounding could carry a NaN's payload into the sign or make it Inf.
    sign = ((bits >> 16) & 0x8000).astype(np.uint16)
    return np.where(np.isnan(as_f32), sign | np.uint16(0x7FC0), rounded)


def llama_module_features(
    *, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int | None = None
) -> dict[str, tuple[int, int]]:
    """Short module name -> (in_features, out_features) for a Llama layer."""
    dim = head_dim if head_dim is not None else hidden // heads
    return {
        "q_proj": (hidden, heads * dim),
        "k_proj": (hidden, kv_heads * dim),
        "v_proj": (hidden, kv_heads * dim),
        "o_proj": (heads * dim, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }


def module_path(layer: int, target: str) -> str:
    block = "self_attn" if target in ATTENTION_MODULES else "mlp"
    return f"model.layers.{layer}.{block}.{target}"


def tensor_name(layer: int, target: str, kind: Literal["A", "B"]) -> str:
    """PEFT's saved name: ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``."""
    return f"base_model.model.{module_path(layer, target)}.lora_{kind}.weight"


def peft_config(
    *,
    rank: int = 8,
    alpha: float = 16,
    targets: Iterable[str] = ("q_proj", "v_proj"),
    base_model: str | None = DEFAULT_BASE_MODEL,
    rank_pattern: Mapping[str, int] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An ``adapter_config.json`` document shaped like the ones PEFT writes."""
    config: dict[str, Any] = {
        "alpha_pattern": {},
        "auto_mapping": None,
        "base_model_name_or_path": base_model,
        "bias": "none",
        "corda_config": None,
        "eva_config": None,
        "exclude_modules": None,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layer_replication": None,
        "layers_pattern": None,
        "layers_to_transform": None,
        "loftq_config": {},
        "lora_alpha": alpha,
        "lora_bias": False,
        "lora_dropout": 0.05,
        "megatron_config": None,
        "megatron_core": "megatron.core",
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "rank_pattern": dict(rank_pattern or {}),
        "revision": None,
        "target_modules": sorted(targets),
        "target_parameters": None,
        "task_type": "CAUSAL_LM",
        "trainable_token_indices": None,
        "use_dora": False,
        "use_rslora": False,
    }
    config.update(extra or {})
    return config


def write_config(directory: str | Path, config: Mapping[str, Any]) -> Path:
    path = Path(directory) / "adapter_config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def _adapter_specs(
    layers: int,
    targets: tuple[str, ...],
    features: Mapping[str, tuple[int, int]],
    ranks: Mapping[str, int],
    dtype: str,
) -> list[TensorSpec]:
    specs: list[TensorSpec] = []
    for layer in range(layers):
        for target in targets:
            in_f, out_f = features[target]
            specs.append((tensor_name(layer, target, "A"), dtype, (ranks[target], in_f)))
            specs.append((tensor_name(layer, target, "B"), dtype, (out_f, ranks[target])))
    return specs


class _ValueMaker:
    """Produces each tensor's values on demand, in file order."""

    def __init__(
        self, specs: list[TensorSpec], *, seed: int, dtype: str, zero_b: bool, inject: str | None
    ) -> None:
        self.shapes = {name: shape for name, _dtype, shape in specs}
        self.last = specs[-1][0]
        self.rng = np.random.default_rng(seed)
        self.dtype, self.zero_b, self.inject = dtype, zero_b, inject

    def __call__(self, name: str) -> Array:
        shape = self.shapes[name]
        if self.zero_b and name.endswith("lora_B.weight"):
            values = np.zeros(shape, dtype=np.float32)
        else:
            values = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        if self.inject is not None and name == self.last:
            values.reshape(-1)[values.size // 2] = np.nan if self.inject == "nan" else np.inf
        return to_bf16_bits(values) if self.dtype == "bfloat16" else values.astype(self.dtype)


def make_adapter(
    directory: str | Path,
    *,
    rank: int = 8,
    alpha: float = 16,
    targets: Iterable[str] = ("q_proj", "v_proj"),
    hidden: int = 128,
    intermediate: int = 256,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 4,
    head_dim: int | None = None,
    dtype: str = "float32",
    base_model: str | None = DEFAULT_BASE_MODEL,
    seed: int = 0,
    zero_b: bool = False,
    inject: Literal["nan", "inf"] | None = None,
    rank_pattern: Mapping[str, int] | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> Path:
    """Write a valid PEFT LoRA adapter for a Llama of the given shape; return its dir.

    ``inject`` puts one NaN/Inf in the middle of the last tensor written (the
    ``lora_B`` of the last target in the last layer), so a scan has to read
    everything before it. ``rank_pattern`` keys are short module names.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    targets = tuple(targets)
    features = llama_module_features(
        hidden=hidden, intermediate=intermediate, heads=heads, kv_heads=kv_heads, head_dim=head_dim
    )
    ranks = {t: (rank_pattern or {}).get(t, rank) for t in targets}
    specs = _adapter_specs(layers, targets, features, ranks, _ADAPTER_DTYPES[dtype])
    produce = _ValueMaker(specs, seed=seed, dtype=dtype, zero_b=zero_b, inject=inject)
    _write_streamed(directory / "adapter_model.safetensors", specs, produce, {"format": "pt"})
    config = peft_config(rank=rank, alpha=alpha, targets=targets, base_model=base_model,
                         rank_pattern=rank_pattern, extra=extra_config)  # fmt: skip
    write_config(directory, config)
    return directory


def make_base_config(
    path: str | Path,
    *,
    hidden: int = 128,
    intermediate: int = 256,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 4,
    head_dim: int | None = None,
    model_type: str = "llama",
    vocab_size: int = 256,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write an HF Llama-style ``config.json`` (into ``path`` if it is a directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab_size,
        "max_position_embeddings": 256,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
    }
    if head_dim is None:
        del config["head_dim"]
    config.update(extra or {})
    path.write_text(json.dumps(config, indent=2))
    return path


def pack_adapter(
    source: str | Path,
    archive: str | Path,
    *,
    fmt: Literal["tar.gz", "tar", "zip"] = "tar.gz",
    top_dir: str | None = "adapter",
) -> Path:
    """Pack every file of ``source`` into an archive, under ``top_dir`` if given."""
    source, archive = Path(source), Path(archive)
    files = sorted(p for p in source.rglob("*") if p.is_file())
    prefix = f"{top_dir}/" if top_dir else ""
    arcname = {p: prefix + p.relative_to(source).as_posix() for p in files}
    if fmt == "zip":
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
            for p in files:
                zf.write(p, arcname[p])
    else:
        with tarfile.open(archive, "w:gz" if fmt == "tar.gz" else "w") as tf:
            for p in files:
                tf.add(p, arcname[p])
    return archive
