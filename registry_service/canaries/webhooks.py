"""Webhook gates: the user's own checks of a canary (golden prompts, an eval harness).

Each gate is an HTTP POST of ``{"phase": ..., "canary": <the canary object>}`` to its
URL, signed so the receiver knows it comes from this registry: the header
``X-Loraplane-Signature: sha256=<hex>`` is HMAC-SHA256, keyed with the registry's
webhook secret, of ``<timestamp>.<body>``, the timestamp (Unix seconds) being
``X-Loraplane-Timestamp`` (a receiver refuses old ones: no replay). An answer 2xx
within the gate's timeout passes; any other status, a timeout or no answer fails. The
answer's body is read up to ``MAX_ANSWER_BYTES`` and quoted in the check. Redirects
are not followed, no proxy from the environment is used, and only hosts in
``LORAPLANE_CANARY_WEBHOOK_HOSTS`` may be named (checked at the canary's start).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from urllib.parse import urlsplit

import httpx

from loraplane.api.canaries import Canary, CanaryCheck, CanaryWebhook, GatePhase
from loraplane.private_files import read_or_create_secret
from registry_service.errors import InvalidInput
from registry_service.settings import WEBHOOK_SECRET_FILE, RegistrySettings

SIGNATURE_HEADER = "X-Loraplane-Signature"
TIMESTAMP_HEADER = "X-Loraplane-Timestamp"
MAX_ANSWER_BYTES = 4096
_QUOTED = 200


def webhook_secret(settings: RegistrySettings) -> bytes:
    """The key gates are signed with: the setting, else the data directory's file."""
    if settings.canary_webhook_secret is not None:
        return settings.canary_webhook_secret.get_secret_value().encode()
    secret, _made = read_or_create_secret(settings.data_dir / WEBHOOK_SECRET_FILE,
                                          lambda: secrets.token_hex(32))
    return secret.encode()


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The value of ``X-Loraplane-Signature`` for ``body`` sent at ``timestamp``."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body,
                                hashlib.sha256).hexdigest()


def check_hosts(hooks: list[CanaryWebhook], allowed: list[str]) -> None:
    """Refuse a gate whose host is not one the registry may call (422)."""
    hosts = {host.lower() for host in allowed}
    for hook in hooks:
        host = (urlsplit(hook.url).hostname or "").lower()
        if host not in hosts:
            raise InvalidInput(
                f"webhook {hook.name!r}: the registry may not call {host or hook.url!r}; "
                "an operator allows hosts with LORAPLANE_CANARY_WEBHOOK_HOSTS",
                code="webhook_host_not_allowed", detail={"webhook": hook.name, "host": host})


def webhook_client() -> httpx.AsyncClient:
    """The client gates are sent with: no proxy or netrc from the environment, no
    redirects, no cookies kept between calls."""
    return httpx.AsyncClient(trust_env=False, follow_redirects=False,
                             headers={"User-Agent": "loraplane-canary-gate"})


async def run_gates(http: httpx.AsyncClient, canary: Canary, phase: GatePhase,
                    secret: bytes) -> list[CanaryCheck]:
    """Every gate of ``phase``, at once; one check each, in the analysis' order."""
    hooks = [hook for hook in canary.analysis.webhooks if hook.phase == phase]
    if not hooks:
        return []
    body = json.dumps({"phase": phase, "canary": canary.model_dump(mode="json")},
                      separators=(",", ":")).encode()
    return list(await asyncio.gather(*(_gate(http, hook, body, secret) for hook in hooks)))


async def _gate(http: httpx.AsyncClient, hook: CanaryWebhook, body: bytes,
                secret: bytes) -> CanaryCheck:
    stamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", TIMESTAMP_HEADER: stamp,
               SIGNATURE_HEADER: signature(secret, stamp, body)}
    try:
        async with asyncio.timeout(hook.timeout_s):
            async with http.stream("POST", hook.url, content=body, headers=headers) as answer:
                text = await _bounded(answer)
    except TimeoutError:
        return _check(hook, None, f"webhook {hook.name} did not answer within "
                                  f"{hook.timeout_s:g} s")
    except (httpx.HTTPError, OSError) as exc:
        return _check(hook, None, f"webhook {hook.name} could not be called: "
                                  f"{type(exc).__name__}")
    status = answer.status_code
    said = f": {text[:_QUOTED]}" if text and not 200 <= status < 300 else ""
    return _check(hook, status, f"webhook {hook.name} answered {status}{said}")


async def _bounded(answer: httpx.Response) -> str:
    data = b""
    async for chunk in answer.aiter_bytes():
        data += chunk[:MAX_ANSWER_BYTES - len(data)]
        if len(data) >= MAX_ANSWER_BYTES:
            break
    return data.decode(errors="replace").strip()


def _check(hook: CanaryWebhook, status: int | None, detail: str) -> CanaryCheck:
    passed = status is not None and 200 <= status < 300
    return CanaryCheck(metric=f"webhook:{hook.name}", stable=None,
                       canary=None if status is None else float(status), threshold=299,
                       stable_requests=0, canary_requests=0,
                       verdict="pass" if passed else "fail", detail=detail)
