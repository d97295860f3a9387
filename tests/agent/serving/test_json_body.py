"""The proxy's reading and rewriting of request bodies: orjson where it can, the
standard library for what only the standard library reads, as every body was before."""

from __future__ import annotations

import json

import pytest

from inference_agent.serving.json_body import encode_body, parse_body
from inference_agent.serving.openai_errors import ProxyError


def _round_trip(raw: bytes) -> tuple[bytes | ProxyError, bool]:
    parsed = parse_body(raw)
    assert not isinstance(parsed, ProxyError), parsed
    body, exact = parsed
    body["model"] = "bot@3"
    return encode_body(body, exact), exact


def test_a_plain_body_is_passed_on_with_the_versioned_model_and_nothing_else_changed() -> None:
    raw = json.dumps({"model": "bot", "prompt": "héllo ✓", "max_tokens": 1,
                      "temperature": 0.7, "logit_bias": {"42": -100},
                      "stop": ["\n"], "seed": 2**53 + 1}).encode()
    sent, exact = _round_trip(raw)
    assert exact and isinstance(sent, bytes)
    assert json.loads(sent) == {**json.loads(raw), "model": "bot@3"}


@pytest.mark.parametrize("raw", [
    b'{"model": "bot", "seed": 123456789012345678901234567890}',  # beyond 64 bits
    b'{"model": "bot", "seed": 18446744073709551615}',  # 2**64 - 1
    '{"model": "bot", "prompt": "hi"}'.encode("utf-16"),  # JSON may be UTF-16
])
def test_what_only_the_standard_library_reads_is_passed_on_as_before(raw: bytes) -> None:
    sent, exact = _round_trip(raw)
    assert not exact and isinstance(sent, bytes)
    assert json.loads(sent) == {**json.loads(raw), "model": "bot@3"}


@pytest.mark.parametrize("raw", [b'{"model": "bot", "temperature": NaN}',
                                 b'{"model": "bot", "prompt": "\\ud800"}'])
def test_a_body_that_cannot_be_passed_on_as_json_is_a_clear_400(raw: bytes) -> None:
    sent, exact = _round_trip(raw)
    assert not exact and isinstance(sent, ProxyError)
    assert (sent.status, sent.code) == (400, "invalid_json")


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b'"model"', b"\xff\xfe\xfa"])
def test_a_body_that_is_not_a_json_object_is_a_clear_400(raw: bytes) -> None:
    refused = parse_body(raw)
    assert isinstance(refused, ProxyError)
    assert (refused.status, refused.code) == (400, "invalid_json")
