"""The import arrows point one way.

``loraplane`` is the shared core: it imports neither service, nor the CLI. The registry
and the agent never import each other. The CLI (``loraplane_cli``) sits above both. No
production package imports the development harness, the tests, the benchmarks, the
scripts or ``deploy``, and the harness imports none of the last four (``deploy`` builds
deployment artefacts and imports no project package). Every import counts, also one
inside a function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = ("loraplane", "loraplane_cli", "registry_service", "inference_agent", "migrations")
ABOVE_PRODUCTION = ("devharness", "tests", "bench", "scripts", "deploy")
# Top-level package -> the top-level packages it must never import.
FORBIDDEN: dict[str, set[str]] = {
    "loraplane": {"registry_service", "inference_agent", "loraplane_cli", "migrations"},
    "registry_service": {"inference_agent", "loraplane_cli"},
    "migrations": {"inference_agent", "loraplane_cli"},
    "inference_agent": {"registry_service", "loraplane_cli", "migrations"},
    "loraplane_cli": set(),
    "devharness": {"tests", "bench", "scripts", "deploy"},
    # deploy/ builds deployment artefacts (the Grafana dashboard); it reads no project code.
    "deploy": {*PRODUCTION, "devharness", "tests", "bench", "scripts"},
}
for package in PRODUCTION:
    FORBIDDEN[package] |= set(ABOVE_PRODUCTION)


def imported_packages(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every absolute import in the module at ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def violations(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, target in imported_packages(path):
            if target in FORBIDDEN[package]:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return found


def test_every_package_is_checked() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages <= set(FORBIDDEN) | {"tests", "bench", "scripts"}, packages - set(FORBIDDEN)


def test_imports_point_one_way() -> None:
    found = [v for package in FORBIDDEN for v in violations(package)]
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f() -> None:\n    from registry_service.app import create_app\n")
    assert list(imported_packages(module)) == [(2, "registry_service")]
