"""What changed between two versions: their configs' keys and their files."""

from __future__ import annotations

from typing import Any

from loraplane.events import FileRef
from registry_service.ui.schemas import ConfigChange, FileChange


def config_changes(base: dict[str, Any], head: dict[str, Any]) -> list[ConfigChange]:
    """The top-level keys of ``adapter_config.json`` added, removed or changed, by key."""
    changes: list[ConfigChange] = []
    for key in sorted(base.keys() | head.keys()):
        if key not in head:
            changes.append(ConfigChange(key=key, change="removed", before=base[key]))
        elif key not in base:
            changes.append(ConfigChange(key=key, change="added", after=head[key]))
        elif base[key] != head[key]:
            changes.append(ConfigChange(key=key, change="changed", before=base[key],
                                        after=head[key]))
    return changes


def file_changes(base: list[FileRef], head: list[FileRef]) -> list[FileChange]:
    """Every file of either version, by name; "changed" means other bytes (sha256)."""
    before = {f.name: f for f in base}
    after = {f.name: f for f in head}
    changes: list[FileChange] = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old is None or new is None:
            change = "added" if old is None else "removed"
        else:
            change = "same" if old.sha256 == new.sha256 else "changed"
        changes.append(FileChange(name=name, change=change,
                                  before_size=old.size if old else None,
                                  after_size=new.size if new else None))
    return changes
