"""Whether two versions of an adapter face the same base model.

A version's LoRA maps each module's ``in_features`` (lora_A's columns) to its
``out_features`` (lora_B's rows): those are the base model's. A different rank changes
neither, so retraining at another rank is no change; another hidden size changes them,
and means the version was trained for another model than the versions before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loraplane.lora.errors import AdapterInvalid

Features = Mapping[str, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class ShapeChange:
    """The first module (by path) whose base-model-facing shape differs from a version's."""

    module: str
    version: int
    before: tuple[int, int]
    after: tuple[int, int]

    def describe(self) -> str:
        return (f"module {self.module!r} maps {self.after[0]} -> {self.after[1]} features, but "
                f"in version {self.version} it maps {self.before[0]} -> {self.before[1]}")

    def detail(self) -> dict[str, Any]:
        return {"module": self.module, "version": self.version,
                "in_features": self.after[0], "out_features": self.after[1],
                "expected_in_features": self.before[0], "expected_out_features": self.before[1]}

    def refusal(self) -> AdapterInvalid:
        return AdapterInvalid(
            "shape_mismatch",
            f"{self.describe()}: this version was trained for another base model than the "
            "adapter's current versions. Push it to an adapter of its own base model; if "
            "the base model really changed, push again with --allow-shape-change "
            "(allow_shape_change=true)",
            self.detail(),
        )


def find_shape_change(new: Features, old: Features, *, version: int) -> ShapeChange | None:
    """The first module both versions adapt whose (in, out) features differ, else None.

    Modules only one of them adapts are no conflict: targeting more or fewer modules of
    the same base model is an ordinary retraining."""
    for path in sorted(new.keys() & old.keys()):
        if new[path] != old[path]:
            return ShapeChange(module=path, version=version, before=old[path], after=new[path])
    return None
