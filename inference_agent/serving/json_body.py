"""A proxied request's JSON body: read, given its versioned ``model``, written again.

orjson does both in a fraction of the standard library's time, and a long prompt makes
the body the largest thing the proxy handles. What orjson refuses but the standard
library reads (NaN, lone surrogates, UTF-16) keeps the standard library's treatment,
so no body that was passed on before is refused now; and so does a body with a number
of 19 digits or more, since orjson reads an integer beyond 64 bits as a float.

A body nested deeper than either parser goes (orjson reads 1,024 levels and writes 255,
the standard library about 1,000, Python's recursion limit) is a 400
``json_too_deep``, never the ``RecursionError`` or ``JSONEncodeError`` it raised (a
500).
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import orjson

from inference_agent.serving.openai_errors import ProxyError, bad_request

# 2**63 has 19 digits: a run this long (in a number or a string) may not fit orjson.
_LONG_DIGITS = re.compile(rb"\d{19}")


def parse_body(raw: bytes) -> tuple[dict[str, Any], bool] | ProxyError:
    """The request's JSON object, and whether orjson read it (then orjson writes it
    back exactly), or the 400 for a body that is not a JSON object."""
    body: object = None
    exact = False
    if _LONG_DIGITS.search(raw) is None:
        with contextlib.suppress(orjson.JSONDecodeError):
            body, exact = orjson.loads(raw), True
    if not exact:
        try:
            body = json.loads(raw)
        except RecursionError:
            return _too_deep()
        except (ValueError, UnicodeDecodeError) as exc:
            return bad_request(f"the request body is not valid JSON: {exc}",
                               code="invalid_json")
    if not isinstance(body, dict):
        return bad_request("the request body must be a JSON object", code="invalid_json")
    return body, exact


def encode_body(body: dict[str, Any], exact: bool) -> bytes | ProxyError:
    """The body to send on to vLLM; ``exact`` as ``parse_body`` said."""
    if exact:
        try:
            return orjson.dumps(body)
        except orjson.JSONEncodeError:
            pass  # nested deeper than orjson writes (255 levels): as the library writes
    try:
        # As httpx wrote every body before: compact, UTF-8, no NaN.
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode()
    except RecursionError:
        return _too_deep()
    except ValueError as exc:  # NaN or Infinity, a lone surrogate: vLLM reads neither
        return bad_request(f"the request body cannot be passed on as JSON: {exc}",
                           code="invalid_json")


def _too_deep() -> ProxyError:
    return bad_request("the request body is nested too deeply to be read as JSON",
                       code="json_too_deep")
