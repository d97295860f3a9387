"""Where inference credentials come from: the registry (refreshed) and a keys file.

The registry's list is re-read when a ``credentials_changed`` event arrives and every
``credentials_refresh_s`` seconds whatever happens, so a revocation is honoured within
that interval even if its event is lost. While the registry cannot be read, the last
list read stays in force (requests keep being served; revocations wait).

A keys file (``--keys-file``) is read once at start-up and refused whole if any line
is wrong. One credential per line, ``<tenant> <sha256 of the token, hex>``; blank
lines and lines starting with ``#`` are skipped. It holds no secret: the hash of a
token is ``printf %s "$TOKEN" | sha256sum``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from inference_agent.errors import AgentError
from inference_agent.serving.auth import InferenceKeys
from loraplane.naming import is_slug

log = logging.getLogger(__name__)

REGISTRY_SOURCE = "registry"
KEYS_FILE_SOURCE = "keys-file"
_HASH = re.compile(r"^[0-9a-f]{64}$")


class KeysFileError(ValueError):
    """A keys file that cannot be used; the message says which line and why."""


def read_keys_file(path: Path) -> dict[str, str]:
    """token sha256 -> tenant from ``path``; KeysFileError for any bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysFileError(f"--keys-file {path}: cannot read it: {exc}") from exc
    keys: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2 or not is_slug(fields[0]) or not _HASH.fullmatch(fields[1]):
            raise KeysFileError(
                f"--keys-file {path}, line {number}: expected '<tenant> <sha256 hex>' "
                "(a tenant slug and the 64 lower-case hex digits of the token's sha256)")
        if keys.get(fields[1], fields[0]) != fields[0]:
            raise KeysFileError(f"--keys-file {path}, line {number}: this hash is listed "
                                "for two tenants")
        keys[fields[1]] = fields[0]
    if not keys:
        raise KeysFileError(f"--keys-file {path} lists no credential: no request could "
                            "be served")
    return keys


Fetch = Callable[[], Awaitable[dict[str, str]]]


class CredentialsRefresher:
    """Keeps the registry's inference credentials in ``keys`` fresh."""

    def __init__(self, fetch: Fetch, keys: InferenceKeys, *, interval_s: float) -> None:
        self._fetch = fetch
        self._keys = keys
        self.interval_s = interval_s
        self._wake = asyncio.Event()
        self.refreshes = 0

    def poke(self) -> None:
        """Re-read now (a credentials_changed event, or a resync after a NATS break)."""
        self._wake.set()

    async def refresh(self) -> None:
        """Read the registry's list once; raises the registry's AgentError."""
        hashes = await self._fetch()
        self._keys.replace(REGISTRY_SOURCE, hashes)
        self.refreshes += 1

    async def run(self) -> None:
        """Refresh on every poke and every ``interval_s``, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            try:
                await self.refresh()
            except AgentError as exc:
                log.warning("reading inference credentials failed: %s; the last list "
                            "read stays in force", exc.message)
