"""bench/ holds the benchmarks docs/benchmarks.md names and the helpers they import,
nothing else (issue 37): a file no one names or imports is an experiment left behind."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _bench_imports(path: Path) -> set[str]:
    """The bench modules ``path`` imports, by module name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "bench":
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[1] for alias in node.names
                         if alias.name.startswith("bench."))
    return names


def test_every_bench_file_is_a_named_benchmark_or_a_helper_of_one() -> None:
    modules = {path.stem: path for path in BENCH.glob("*.py") if path.stem != "__init__"}
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    named = {stem for stem in modules if re.search(rf"bench[./]{stem}\b", page)}
    assert named, "docs/benchmarks.md names no benchmark: the pattern no longer matches"
    reached, frontier = set(named), list(named)
    while frontier:
        for imported in _bench_imports(modules[frontier.pop()]):
            if imported in modules and imported not in reached:
                reached.add(imported)
                frontier.append(imported)
    assert sorted(set(modules) - reached) == []


def test_the_goals_table_fits_on_a_screen() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    table = page.split("## Where the goals stand", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert 3 <= len(rows) <= 15
    assert max(len(row) for row in rows) <= 400
