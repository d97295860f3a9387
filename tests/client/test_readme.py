"""The README's Python example runs as written against a real registry."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from pathlib import Path

from devharness.adapters import make_adapter
from devharness.http_registry import Served

README = Path(__file__).parents[2] / "README.md"


def example() -> str:
    section = README.read_text().split("### Using the registry from Python", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "the README has no Python example"
    return found.group(1)


def run(code: str, url: str, token: str, folder: Path) -> str:
    code = code.replace('"http://127.0.0.1:8080"', repr(url))
    code = code.replace('Path("my-adapter', f'Path({str(folder)!r} + "/my-adapter')
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {"token": token})
    return printed.getvalue()


async def test_the_readme_example_runs(served: Served, tmp_path: Path) -> None:
    make_adapter(tmp_path / "my-adapter", seed=1)
    make_adapter(tmp_path / "my-adapter-v2", seed=2)
    printed = await asyncio.to_thread(run, example(), served.url, served.admin_token,
                                      tmp_path)
    lines = printed.splitlines()
    assert re.fullmatch(r"2 [0-9a-f]{64} True", lines[0]), printed
    assert lines[1:] == ["3 rollback 2 -> 1", "2 promote 1 -> 2", "1 publish None -> 1"], printed
