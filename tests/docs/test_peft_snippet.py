"""The README's PEFT snippet writes a folder loraplane takes, on the demo's tiny model.

It runs in the vLLM venv (where torch, transformers and PEFT live) with only the
model's name changed to the tiny Llama's folder, offline; the folder it writes must
pass the same validation an upload does, shapes checked against that model.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from loraplane.lora.base_model import BaseModelShapes
from loraplane.lora.validate import validate_adapter_dir
from tests.docs.doc_blocks import ROOT, blocks

PLACEHOLDER = '"your-org/your-base-model"'


def snippet() -> str:
    found = [b.code for b in blocks(ROOT / "README.md")
             if b.lang == "python" and "peft" in b.code]
    assert len(found) == 1 and PLACEHOLDER in found[0], "the README's PEFT snippet changed"
    return found[0]


def test_the_peft_snippet_writes_an_adapter_loraplane_takes(
        vllm_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    base = tiny_model / "base"
    code = snippet().replace(PLACEHOLDER, repr(str(base)))
    done = subprocess.run([str(vllm_python), "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False, stdin=subprocess.DEVNULL,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    adapter = tmp_path / "my-adapter"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in adapter.iterdir()}
    summary = validate_adapter_dir(adapter, base_shapes=BaseModelShapes.from_hf_config(base))
    assert summary.rank == 8
