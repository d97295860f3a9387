"""Inference credentials: which bearer tokens may call the OpenAI API, for which tenant.

The agent never sees a secret it did not receive in a request: it holds the sha256 of
each live inference token with its tenant, from the registry (``GET
/v1/agents/credentials``) and/or a local keys file, and checks a request by hashing its
bearer token. No request waits on the registry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from inference_agent.serving.openai_errors import ProxyError

_BEARER = "bearer "


def token_hash(secret: str) -> str:
    """The sha256 the registry stores for a token (hex), as in the keys file."""
    return hashlib.sha256(secret.encode()).hexdigest()


def unauthorized(message: str, code: str) -> ProxyError:
    return ProxyError(401, message, "authentication_error", code,
                      headers=(("WWW-Authenticate", "Bearer"),))


class InferenceKeys:
    """token sha256 -> tenant, merged from named sources (``registry``, ``keys-file``).

    Each source is replaced whole, so a revoked token disappears at the next refresh of
    the source that listed it.
    """

    def __init__(self) -> None:
        self._sources: dict[str, dict[str, str]] = {}
        self._merged: dict[str, str] = {}

    def replace(self, source: str, hashes: Mapping[str, str]) -> None:
        self._sources[source] = dict(hashes)
        merged: dict[str, str] = {}
        for entries in self._sources.values():
            merged.update(entries)
        self._merged = merged  # one assignment: a request sees the old set or the new

    def loaded(self, source: str) -> bool:
        return source in self._sources

    def __len__(self) -> int:
        return len(self._merged)

    def tenant_for(self, authorization: str | None) -> str | ProxyError:
        """The tenant of a request's ``Authorization`` header, or its 401."""
        if not authorization:
            return unauthorized("an inference token is required: "
                                "Authorization: Bearer <token>", "missing_api_key")
        if authorization[:len(_BEARER)].lower() != _BEARER:
            return unauthorized("the Authorization header must be Bearer <token>",
                                "invalid_api_key")
        tenant = self._merged.get(token_hash(authorization[len(_BEARER):].strip()))
        if tenant is None:
            return unauthorized("the inference token is unknown or revoked",
                                "invalid_api_key")
        return tenant
