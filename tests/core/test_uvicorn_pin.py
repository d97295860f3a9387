"""uvicorn is the release the project's protocol subclasses were tested on.

loraplane/http_guard.py, registry_service/http_body.py and
inference_agent/serving/direct_protocol.py subclass uvicorn's ``HttpToolsProtocol`` and
use its private names; their behaviour tests (tests/*/test_connection_limits.py,
tests/registry/test_http_body.py, tests/agent/serving/test_direct_protocol.py) run them
on a real server. This test fails when another uvicorn is installed than the range
pyproject.toml pins, or when a private name they use is gone: move the pin only after
those tests pass on the new release.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import uvicorn
from packaging.requirements import Requirement
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def pinned() -> Requirement:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    [found] = [Requirement(r) for r in project["dependencies"]
               if Requirement(r).name == "uvicorn"]
    return found


def test_the_installed_uvicorn_is_in_the_pinned_range() -> None:
    requirement = pinned()
    assert requirement.specifier, "uvicorn must be pinned to the releases tested"
    assert requirement.specifier.contains(uvicorn.__version__), (
        f"uvicorn {uvicorn.__version__} is outside {requirement}")


def test_the_private_names_the_subclasses_use_are_there() -> None:
    for name in ("HEADER_RE", "HEADER_VALUE_RE", "STATUS_LINE"):
        assert hasattr(httptools_impl, name), name
    for method in ("_start_asgi_task", "on_body", "on_headers_complete", "on_message_begin",
                   "connection_made", "connection_lost", "data_received"):
        assert callable(getattr(HttpToolsProtocol, method, None)), method
    for method in ("run_asgi", "send", "receive"):
        assert callable(getattr(RequestResponseCycle, method, None)), method
