"""Small assertion helpers shared by the tests in this package."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loraplane.lora import AdapterInvalid


def expect_refusal(
    code: str, func: Callable[..., Any], *args: Any, **kwargs: Any
) -> AdapterInvalid:
    """Call ``func`` and return the AdapterInvalid it must raise with ``code``."""
    with pytest.raises(AdapterInvalid) as info:
        func(*args, **kwargs)
    assert info.value.code == code, f"expected {code}, got {info.value.code}: {info.value.message}"
    return info.value


def leftovers(dest: Path) -> list[str]:
    """Everything under ``dest`` (empty when dest is gone or empty)."""
    if not dest.exists():
        return []
    return sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*"))
