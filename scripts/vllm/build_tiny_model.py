# transformers leaves its model/tokenizer constructors unannotated.
# mypy: disable-error-code="no-untyped-call"
"""Build a tiny random Llama, its tokenizer and a set of LoRA test adapters, offline.

Run with the vLLM venv's python (it needs torch, transformers, tokenizers, peft):

    ~/.cache/loraplane/vllm-venv/bin/python scripts/vllm/build_tiny_model.py OUT_DIR \
        [--base-model-name tiny-llama]

Layout of OUT_DIR:
    base/                    safetensors weights, config, tokenizer (with a chat template)
    adapters/<name>/         adapter_config.json + adapter_model.safetensors (PEFT format)
    manifest.json            written last; its presence means the build is complete

Everything is seeded, so two builds with the same recipe give the same weights. A build
is skipped when manifest.json already records the same recipe version and base name.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Set before transformers/peft import: nothing here may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

# Bump whenever anything below changes the produced files.
RECIPE_VERSION = 2
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
VOCAB_SIZE = 1024
BASE_SEED = 1234
# Large enough that every adapter moves the greedy path of a random model.
LORA_B_STD = 0.2
SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "<|eos|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CORPUS = (
    "A control plane keeps every adapter version and moves aliases between them.",
    "The quick brown fox jumps over the lazy dog while the registry publishes events.",
    "Inference agents fetch adapters, check each file's sha256 and load them into vLLM.",
    "Requests hold a lease on the version they started on until they finish streaming.",
    "def swap(old, new):\n    load(new)\n    route(new)\n    drain(old)\n    unload(old)\n",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 42 100 1024 and punctuation: , . ; : ! ? ( ) [ ] { }",
    "Hello! How are you today? I am a tiny language model with random weights.",
    "Promote means move the live alias; rollback means move it back and record the move.",
    "Ünïcödé tëxt, emoji 🙂 and symbols € £ ¥ keep the byte-level tokenizer honest.",
)


@dataclass(frozen=True)
class AdapterSpec:
    """One test adapter: what it is for and how to make it."""

    name: str
    rank: int
    seed: int
    purpose: str
    hidden_size: int = 128
    zero: bool = False


ADAPTERS = (
    *(AdapterSpec(f"a{i}", 8, 100 + i, "valid; distinct greedy output") for i in range(1, 6)),
    AdapterSpec("zero", 8, 200, "valid; all weights zero, so output equals the base", zero=True),
    AdapterSpec("bad-rank", 32, 300, "rank 32, above the server's max-lora-rank 16; refused"),
    # vLLM copies LoRA weights into zero-padded slots, so a narrower adapter loads and
    # serves silently; only the agent's shape check catches it. A wider one is refused.
    AdapterSpec(
        "other-base", 8, 400, "made for a hidden-64 Llama; vLLM accepts it", hidden_size=64
    ),
    AdapterSpec(
        "other-base-wide", 8, 500, "made for a hidden-256 Llama; vLLM refuses it", hidden_size=256
    ),
)


def llama_config(hidden_size: int, vocab_size: int, specials: dict[str, int]) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=specials["<|bos|>"],
        eos_token_id=specials["<|eos|>"],
        pad_token_id=specials["<|pad|>"],
        dtype="float32",
    )


def build_tokenizer() -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the corpus gives merges enough counts to fill a useful vocabulary.
    raw.train_from_iterator(list(CORPUS) * 8, trainer=trainer)
    bos_id = raw.token_to_id("<|bos|>")
    raw.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        additional_special_tokens=list(SPECIALS[3:]),
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def special_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIALS}
    return {token: int(value) for token, value in ids.items() if isinstance(value, int)}


def build_base(hidden_size: int, tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = llama_config(hidden_size, len(tokenizer), special_ids(tokenizer))
    model = LlamaForCausalLM(config)
    model.eval()
    return model


def make_adapter(base: LlamaForCausalLM, spec: AdapterSpec) -> PeftModel:
    lora = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.rank * 2,
        target_modules=list(TARGET_MODULES),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(spec.seed)
    peft_model = get_peft_model(copy.deepcopy(base), lora)
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if spec.zero and "lora_" in name:
                param.zero_()
            elif "lora_B" in name:
                # PEFT starts B at zero, which would make the adapter a no-op.
                param.copy_(torch.randn(param.shape, generator=generator) * LORA_B_STD)
    peft_model.eval()
    return peft_model


def save_adapter(peft_model: PeftModel, out: Path, base_model_name: str) -> None:
    peft_model.save_pretrained(str(out), safe_serialization=True)
    (out / "README.md").unlink(missing_ok=True)
    config_path = out / "adapter_config.json"
    config: dict[str, Any] = json.loads(config_path.read_text())
    # Registry, agent and vLLM all name the base model, never a local path.
    config["base_model_name_or_path"] = base_model_name
    # PEFT keeps target_modules as a set; sort it so rebuilds are byte-identical.
    config["target_modules"] = sorted(config["target_modules"])
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def greedy_ids(model: torch.nn.Module, prompt_ids: torch.Tensor, steps: int = 16) -> list[int]:
    ids = prompt_ids
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=ids).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(dim=-1)], dim=1)
    return [int(token) for token in ids[0, prompt_ids.shape[1] :]]


def check_outputs(outputs: dict[str, list[int]]) -> None:
    """Fail the build if the adapters would not be told apart by greedy decoding."""
    if outputs["zero"] != outputs["base"]:
        raise RuntimeError("the zero adapter changed the base model's greedy output")
    valid = [f"a{i}" for i in range(1, 6)] + ["base"]
    seen: dict[tuple[int, ...], str] = {}
    for name in valid:
        key = tuple(outputs[name])
        if key in seen:
            raise RuntimeError(f"adapters {seen[key]} and {name} give the same greedy output")
        seen[key] = name


def build_adapters(
    base: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path, base_model_name: str
) -> dict[str, dict[str, Any]]:
    prompt = torch.tensor([tokenizer("The registry publishes")["input_ids"]])
    outputs = {"base": greedy_ids(base, prompt)}
    bases = {base.config.hidden_size: base}
    entries: dict[str, dict[str, Any]] = {}
    for spec in ADAPTERS:
        if spec.hidden_size not in bases:
            bases[spec.hidden_size] = build_base(spec.hidden_size, tokenizer, BASE_SEED + 1)
        peft_model = make_adapter(bases[spec.hidden_size], spec)
        if spec.hidden_size == base.config.hidden_size and spec.rank <= 16:
            outputs[spec.name] = greedy_ids(peft_model, prompt)
        save_adapter(peft_model, out / spec.name, base_model_name)
        entries[spec.name] = {
            "path": f"adapters/{spec.name}",
            "rank": spec.rank,
            "lora_alpha": spec.rank * 2,
            "target_modules": list(TARGET_MODULES),
            "hidden_size": spec.hidden_size,
            "seed": spec.seed,
            "purpose": spec.purpose,
        }
    check_outputs(outputs)
    return entries


def is_current(out_dir: Path, base_model_name: str) -> bool:
    try:
        manifest = json.loads((out_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(
        manifest.get("recipe_version") == RECIPE_VERSION
        and manifest.get("base_model_name") == base_model_name
    )


def build(out_dir: Path, base_model_name: str) -> dict[str, Any]:
    torch.use_deterministic_algorithms(True)
    hf_logging.disable_progress_bar()
    staging = out_dir / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    tokenizer = build_tokenizer()
    base = build_base(128, tokenizer, BASE_SEED)
    base.save_pretrained(str(staging / "base"), safe_serialization=True)
    tokenizer.save_pretrained(str(staging / "base"))
    adapters = build_adapters(base, tokenizer, staging / "adapters", base_model_name)
    # Swap the finished parts in, then write the manifest that marks completion.
    for part in ("base", "adapters"):
        shutil.rmtree(out_dir / part, ignore_errors=True)
        (staging / part).rename(out_dir / part)
    staging.rmdir()
    return {
        "recipe_version": RECIPE_VERSION,
        "base_model_name": base_model_name,
        "base_path": "base",
        "base": {
            "architecture": "LlamaForCausalLM",
            "hidden_size": base.config.hidden_size,
            "num_hidden_layers": base.config.num_hidden_layers,
            "num_attention_heads": base.config.num_attention_heads,
            "intermediate_size": base.config.intermediate_size,
            "vocab_size": base.config.vocab_size,
            "dtype": "float32",
        },
        "adapters": adapters,
    }


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    tmp = out_dir / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    tmp.replace(out_dir / "manifest.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out_dir", type=Path, help="directory to build into")
    parser.add_argument("--base-model-name", default="tiny-llama", help="served base model name")
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir.resolve()
    if is_current(out_dir, args.base_model_name):
        print(f"tiny model already built: {out_dir}")
        return 0
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").unlink(missing_ok=True)
    write_manifest(out_dir, build(out_dir, args.base_model_name))
    print(f"built tiny model in {time.monotonic() - started:.1f}s: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
