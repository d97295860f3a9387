"""loraplane: a control plane for LoRA adapters served by vLLM."""

__version__ = "0.1.0"
