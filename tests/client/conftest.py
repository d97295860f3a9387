"""A registry served over real HTTP on the embedded backend, for the Python client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devharness.adapters import make_adapter
from devharness.http_registry import Served, serve_http
from devharness.services import NatsService


@pytest.fixture
async def served(tmp_path: Path, nats: NatsService) -> AsyncIterator[Served]:
    async with serve_http("embedded", tmp_path / "data", nats) as served:
        yield served


@pytest.fixture
def adapter_dir(tmp_path: Path) -> Path:
    return make_adapter(tmp_path / "adapter-1", seed=1)


@pytest.fixture
def adapter_dir_2(tmp_path: Path) -> Path:
    return make_adapter(tmp_path / "adapter-2", seed=2)
