"""The CLI's side of the registry client: its error type, and how a RegistryError
becomes one.

Every command talks to the registry through ``loraplane.client.RegistryClient``; the
root group turns each ``RegistryError`` into a ``CliError`` here, adding the hints a
person at a terminal needs, so no command ever looks at an HTTP or client exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loraplane.client import (
    DEFAULT_TIMEOUT_S,
    InvalidSource,
    InvalidURL,
    RegistryError,
    TimedOut,
    Unauthorized,
    Unreachable,
)
from loraplane.client.config import DEFAULT_REGISTRY

__all__ = ["DEFAULT_REGISTRY", "DEFAULT_TIMEOUT_S", "CliError", "cli_error"]

_UNREACHABLE_HINT = ("is `loraplane registry serve` running? Point the CLI at it with "
                     "--registry URL or LORAPLANE_REGISTRY.")
_TIMEOUT_HINT = "raise --timeout (LORAPLANE_TIMEOUT) if the registry is busy"
_NO_TOKEN_HINT = ("no token was given: run `loraplane login`, or pass --token (or set "
                  "LORAPLANE_TOKEN)")
_DATA_DIR_HINT = ("; a registry started with `registry serve --data-dir D` keeps its admin "
                  "token in D/admin-token: pass --data-dir D (or set LORAPLANE_DATA_DIR) "
                  "here too, none is in {file}")
_BY_CODE = {
    "tenant_required": "name the tenant: add --tenant NAME",
}
_SOURCE_HINTS = {
    "missing_file": "a PEFT adapter folder holds adapter_config.json and "
                    "adapter_model.safetensors; README.md and tokenizer files are dropped",
}
# A source that is not an adapter at all is a usage error; one that fails to read is not.
_SOURCE_USAGE = {"missing_file", "not_an_adapter", "not_found", "unknown_file"}


class CliError(Exception):
    """An error to show the user as one message, with the exit code to leave with."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "cli_error",
        status: int | None = None,
        detail: Mapping[str, Any] | None = None,
        hint: str | None = None,
        exit_code: int = 1,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.detail: dict[str, Any] = dict(detail or {})
        self.hint = hint
        self.exit_code = exit_code

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message, "detail": self.detail}
        if self.status is not None:
            body["status"] = self.status
        return {"error": body}


def _hint(exc: RegistryError, has_token: bool, missing_token_file: Path | None) -> str | None:
    if isinstance(exc, Unreachable):
        return _UNREACHABLE_HINT
    if isinstance(exc, TimedOut):
        return _TIMEOUT_HINT
    if isinstance(exc, Unauthorized) and not has_token:
        where = _DATA_DIR_HINT.format(file=missing_token_file) if missing_token_file else ""
        return _NO_TOKEN_HINT + where
    if isinstance(exc, InvalidSource):
        return _SOURCE_HINTS.get(exc.code)
    return _BY_CODE.get(exc.code)


def cli_error(exc: RegistryError, *, has_token: bool,
              missing_token_file: Path | None = None) -> CliError:
    """The CliError to show for ``exc``; ``has_token`` says whether a token was sent,
    ``missing_token_file`` which admin token file was looked for in vain."""
    usage = isinstance(exc, InvalidURL) or (
        isinstance(exc, InvalidSource) and exc.code in _SOURCE_USAGE)
    return CliError(exc.message, code=exc.code, status=exc.status, detail=exc.detail,
                    hint=_hint(exc, has_token, missing_token_file),
                    exit_code=2 if usage else 1)
