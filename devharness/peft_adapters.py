"""Adapters written by PEFT's own ``save_pretrained``, unchanged, for tests.

PEFT and torch live only in the vLLM venv, so the writing runs there as a subprocess.
What PEFT writes is what users push: ``adapter_config.json`` with
``base_model_name_or_path`` set to the folder the base was loaded from (or null for
a base built from its config), ``adapter_model.safetensors`` and a ``README.md``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Literal

from devharness.vllm import VllmEnvError

_PROGRAM = r"""
import json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

out, base_dir, hidden, source = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
config = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=hidden * 2,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                     max_position_embeddings=128)
model = LlamaForCausalLM(config)
if source == "path":
    model.save_pretrained(base_dir, safe_serialization=True)
    model = LlamaForCausalLM.from_pretrained(base_dir)
lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                  task_type="CAUSAL_LM")
get_peft_model(model, lora).save_pretrained(out)
"""


def peft_save_pretrained(
    python: Path, out: Path, *, hidden: int = 128, source: Literal["path", "config"] = "path"
) -> Path:
    """Write a LoRA for a 2-layer Llama of ``hidden`` size with PEFT into ``out``.

    ``source="path"``: the base is saved to ``out``'s sibling ``<name>-base`` and loaded
    from there (so the config names that path); ``"config"``: built in memory (null).
    """
    base_dir = out.parent / f"{out.name}-base"
    cmd = [str(python), "-c", _PROGRAM, str(out), str(base_dir), str(hidden), source]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False,
                            stdin=subprocess.DEVNULL, env={"HF_HUB_OFFLINE": "1",
                                                           "PATH": "/usr/bin:/bin"})
    if result.returncode != 0:
        raise VllmEnvError(f"PEFT save_pretrained failed:\n{result.stderr[-3000:]}")
    return out


def base_model_name(adapter: Path) -> str | None:
    """What PEFT wrote as ``base_model_name_or_path``."""
    value = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    return None if value is None else str(value)
