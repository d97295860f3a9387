"""Write a LoRA adapter to push: a PEFT folder for the demo's tiny model, offline.

    python -m scripts.make_adapter DIR [--seed N] [--rank R]

``DIR`` gets ``adapter_config.json`` and ``adapter_model.safetensors`` exactly as PEFT
lays them out, for the base model ``tiny-llama`` (a 2-layer Llama of hidden size 128,
the one ``./scripts/demo.sh`` builds and serves): ``q_proj`` and ``v_proj`` at rank 8,
random weights from ``--seed``, so two seeds give two different versions. It needs no
network, torch or PEFT (devharness/adapters.py writes the bytes), which is why the
README's quickstart uses it; for a real model, PEFT's ``save_pretrained`` writes the
same two files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from devharness.adapters import DEFAULT_BASE_MODEL, make_adapter


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.make_adapter",
                                     description="Write a LoRA adapter for tiny-llama.")
    parser.add_argument("dir", type=Path, help="the folder to write (created if missing)")
    parser.add_argument("--seed", type=int, default=1, help="random weights from this seed")
    parser.add_argument("--rank", type=int, default=8, help="the LoRA rank")
    args = parser.parse_args(argv)
    out = make_adapter(args.dir, seed=args.seed, rank=args.rank, alpha=2 * args.rank)
    print(f"{out}: a LoRA adapter for base model {DEFAULT_BASE_MODEL!r} (rank {args.rank}, "
          f"seed {args.seed})")


if __name__ == "__main__":
    main()
