"""The fenced code blocks of the docs, and a sandbox that runs shell blocks as written.

A block may be preceded by one HTML comment that says how the tests treat it:
``<!-- run -->`` (run in order, each must exit 0), ``<!-- background ... -->`` (started
and left running, as in a second terminal) or ``<!-- covered: ... -->`` (another test
or CI runs it, named in the comment).

The sandbox is a clone made of symlinks to this checkout's files (so what a block
writes lands in a temporary folder), with HOME and XDG_CONFIG_HOME of its own and a
PATH without the project's venv: the blocks must activate it themselves. Each block
runs in a fresh ``bash -euo pipefail`` that starts from the variables the previous
block exported, as the lines of one terminal would.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from devharness.processes import http_probe
from loraplane.netutil import free_port
from loraplane.process import ChildProcess

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_FENCE = re.compile(r"(?:<!--\s*(?P<marker>[\w-]+)(?P<note>[^>]*?)\s*-->\n)?"
                    r"^```(?P<lang>[\w-]*)\n(?P<code>.*?)^```$", re.M | re.S)
# Left out of the sandbox clone: what a block may create, and build output.
_NOT_LINKED = {".git", ".artifacts", "artifacts", ".pytest_cache", ".mypy_cache",
               ".ruff_cache", "my-adapter", "my-adapter-v2", "v2.tar.gz"}
BLOCK_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    marker: str | None
    note: str
    code: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of the Markdown file ``path``, in order."""
    text = path.read_text()
    return [Block(path, text.count("\n", 0, m.start("code")), m["lang"], m["marker"],
                  (m["note"] or "").strip(), m["code"])
            for m in _FENCE.finditer(text)]


def shell_blocks(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.lang in ("bash", "sh", "shell", "console")]


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def command_lines(code: str) -> Iterator[str]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    for raw in joined.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            yield line


class Sandbox:
    """A throwaway clone of the checkout and a user's home, for running shell blocks."""

    def __init__(self, base: Path) -> None:
        self.clone = base / "clone"
        self.home = base / "home"
        self.logs = base / "logs"
        self._env_file = base / "env.sh"
        for folder in (self.clone, self.home / ".config", self.logs):
            folder.mkdir(parents=True)
        for entry in ROOT.iterdir():
            if entry.name not in _NOT_LINKED:
                (self.clone / entry.name).symlink_to(entry)
        self.port = free_port()
        self.registry_url = f"http://127.0.0.1:{self.port}"
        self._env_file.write_text(_exports(self._start_env()))
        self.background: list[ChildProcess] = []

    def _start_env(self) -> dict[str, str]:
        kept = {k: v for k, v in os.environ.items()
                if k in ("LANG", "LC_ALL", "TERM", "TMPDIR", "PIP_CONFIG_FILE")}
        # The README's documented way to move the registry off 8080: the server reads
        # LORAPLANE_PORT, the CLI LORAPLANE_REGISTRY.
        return {**kept, "HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config"),
                "PATH": "/usr/local/bin:/usr/bin:/bin", "LORAPLANE_PORT": str(self.port),
                "LORAPLANE_REGISTRY": self.registry_url}

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        """Run ``block`` in the clone; the variables it exports carry to the next."""
        script = (f"source {self._env_file}\ncd {self.clone}\n{block.code}\n"
                  f"export -p > {self._env_file}\n")
        return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=self.clone,
                              env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
                              check=False)

    def start(self, block: Block, ready_url: str, timeout_s: float = 120.0) -> ChildProcess:
        """Start ``block`` as a second terminal would, and wait until ``ready_url`` answers."""
        script = f"source {self._env_file}\ncd {self.clone}\nexec {block.code.strip()}\n"
        child = ChildProcess(f"block {block.where()}", ["bash", "-euo", "pipefail", "-c", script],
                             log_path=self.logs / f"background-{len(self.background)}.log",
                             env={"PATH": "/usr/bin:/bin"}, cwd=self.clone, own_group=True)
        self.background.append(child)
        child.start()
        child.wait_ready(http_probe(ready_url), timeout_s)
        return child

    def env(self) -> dict[str, str]:
        """The variables the last block left exported."""
        done = subprocess.run(["bash", "-c", f"source {self._env_file}; env -0"],
                              env={"PATH": "/usr/bin:/bin"}, capture_output=True, check=True)
        pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
        return dict(pairs)

    def stop(self) -> None:
        for child in reversed(self.background):
            child.stop()


def _exports(env: Mapping[str, str]) -> str:
    quoted = (f"export {k}='{v.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}'"
              for k, v in env.items())
    return "\n".join(quoted) + "\n"
