"""The diff of two versions, on its own: keys and files added, removed, changed."""

from __future__ import annotations

from loraplane.events import FileRef
from registry_service.ui.diff import config_changes, file_changes


def _file(name: str, size: int, byte: str) -> FileRef:
    return FileRef(name=name, size=size, sha256=byte * 64, url=f"/f/{name}")


def test_config_keys_added_removed_and_changed() -> None:
    changes = config_changes({"r": 8, "bias": "none", "lora_dropout": 0.0},
                             {"r": 16, "bias": "none", "use_rslora": True})
    assert [(c.key, c.change, c.before, c.after) for c in changes] == [
        ("lora_dropout", "removed", 0.0, None),
        ("r", "changed", 8, 16),
        ("use_rslora", "added", None, True),
    ]


def test_files_by_name_compared_by_content() -> None:
    base = [_file("adapter_config.json", 700, "a"), _file("adapter_model.bin", 10, "b"),
            _file("README.md", 5, "c")]
    head = [_file("adapter_config.json", 700, "a"), _file("README.md", 5, "d"),
            _file("adapter_model.safetensors", 20, "e")]
    changes = file_changes(base, head)
    assert [(f.name, f.change, f.before_size, f.after_size) for f in changes] == [
        ("README.md", "changed", 5, 5),  # same size, other bytes
        ("adapter_config.json", "same", 700, 700),
        ("adapter_model.bin", "removed", 10, None),
        ("adapter_model.safetensors", "added", None, 20),
    ]
