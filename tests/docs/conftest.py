"""A sandbox for running the docs' shell blocks (tests/docs/doc_blocks.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.doc_blocks import ROOT, Sandbox


@pytest.fixture(scope="session")
def venv_current() -> None:
    """The checkout's venv as ``./scripts/setup.sh`` leaves it. Run here first, so the
    sandbox's own run of it is the no-op it is for a user on a second run: a real
    install from the sandbox would point the venv's editable install at the sandbox."""
    done = subprocess.run([str(ROOT / "scripts" / "setup.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture
def sandbox(tmp_path: Path, venv_current: None) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path)
    try:
        yield box
    finally:
        box.stop()
