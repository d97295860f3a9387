"""schemathesis hooks for ``test_schemathesis``: loaded by the schemathesis CLI it runs.

Generated names almost never exist, so every operation on an adapter would stop at its
404. Half of the calls (chosen by a hash, so the run stays deterministic) are pointed at
the adapter, version, alias and file the test seeded, and reach the logic behind them.
The run authenticates with one admin token; revoking that token would turn the rest of
the run into 401s, so ``DELETE /v1/tokens/{id}`` never gets its id.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import schemathesis
from schemathesis.generation.case import Case
from schemathesis.hooks import HookContext

KEEP_TOKEN_ENV = "LORAPLANE_SCHEMATHESIS_KEEP_TOKEN_ID"
SEEDED = {"name": "support-bot", "version": 1, "alias": "live",
          "filename": "adapter_config.json"}
# An id no token has, so the call still runs and answers 404.
_NO_SUCH_TOKEN = 2**31 - 1


@schemathesis.hook
def before_call(context: HookContext, case: Case[Any], kwargs: dict[str, Any]) -> None:
    del context, kwargs
    params = case.path_parameters
    if not params:
        return
    method = case.method.upper()
    if method == "DELETE" and case.path == "/v1/tokens/{token_id}":
        if str(params.get("token_id")) == os.environ.get(KEEP_TOKEN_ENV):
            params["token_id"] = _NO_SUCH_TOKEN
    elif method != "DELETE" and zlib.crc32(repr(sorted(params.items())).encode()) % 2 == 0:
        params.update({key: value for key, value in SEEDED.items() if key in params})
