"""A larger random Llama than the tiny one, for adapters of realistic size.

At ``LARGE`` (hidden 512, intermediate 1376, 20 layers, 8 heads) a rank-64 LoRA over
all seven projections is 49.97 MB in float32: per layer 64 x (4 x (512 + 512) +
2 x (512 + 1376) + (1376 + 512)) = 624,640 values. The base is ~63 M parameters
(253 MB), small enough for a CPU vLLM beside the other servers of a shared machine.

The base is built with transformers in the vLLM venv (torch lives only there), seeded,
with the tiny model's tokenizer (``scripts/vllm/build_tiny_model.py``); the adapters
are written by ``devharness/adapters.py: make_adapter``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from devharness.adapters import ALL_MODULES, make_adapter
from devharness.vllm import VllmEnvError, ensure_tiny_model


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int


LARGE = Shape(hidden_size=512, intermediate_size=1376, num_hidden_layers=20,
              num_attention_heads=8)
SMALL = Shape(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=4)  # the tiny model's shape: for the CI version

_PROGRAM = r"""
import json, os, shutil, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from transformers import LlamaConfig, LlamaForCausalLM

tiny, out, shape = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
config = LlamaConfig.from_pretrained(tiny)
for key, value in shape.items():
    setattr(config, key, value)
config.num_key_value_heads = shape["num_attention_heads"]
config.head_dim = shape["hidden_size"] // shape["num_attention_heads"]
config.max_position_embeddings = 2048
torch.manual_seed(4321)
model = LlamaForCausalLM(config)
staging = out + ".staging"
shutil.rmtree(staging, ignore_errors=True)
model.save_pretrained(staging, safe_serialization=True)
for name in os.listdir(tiny):
    if name.startswith(("tokenizer", "special_tokens")):
        shutil.copy(os.path.join(tiny, name), staging)
os.rename(staging, out)
"""


def default_model_dir() -> Path:
    """A per-user cache: the build takes minutes on a busy 2-core machine."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "loraplane" / "bench-large-llama"


def build_model(out_dir: Path, python: Path, shape: Shape = LARGE) -> Path:
    """``out_dir/base``: a random Llama of ``shape`` (reused when already built)."""
    base = out_dir / "base"
    if (base / "config.json").is_file():
        built = json.loads((base / "config.json").read_text())
        if all(built.get(k) == v for k, v in asdict(shape).items()):
            return out_dir
        shutil.rmtree(base)
    tiny = ensure_tiny_model(out_dir / "tiny", python)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [str(python), "-c", _PROGRAM, str(tiny / "base"), str(base), json.dumps(asdict(shape))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise VllmEnvError(f"building the larger Llama failed:\n{done.stderr[-3000:]}")
    return out_dir


def make_large_adapter(directory: Path, *, seed: int, base_model: str,
                       shape: Shape = LARGE, rank: int = 64) -> Path:
    """A rank-``rank`` LoRA over every projection of ``shape`` (about 50 MB at LARGE)."""
    return make_adapter(directory, rank=rank, alpha=rank, targets=ALL_MODULES,
                        hidden=shape.hidden_size, intermediate=shape.intermediate_size,
                        layers=shape.num_hidden_layers, heads=shape.num_attention_heads,
                        kv_heads=shape.num_attention_heads, base_model=base_model,
                        seed=seed)
