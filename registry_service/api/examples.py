"""Examples of answers whose schemas the docs pages cannot illustrate by themselves.

A free-form object (``dict[str, ...]``) in a schema is shown by Swagger UI and ReDoc as
``{"additionalProp1": ...}``, which tells a reader nothing; these are real answers of a
registry with one adapter pushed to ``live`` and one routing rule, taken from a run.
``tests/registry/api/test_openapi.py`` checks that they still parse as the models say.
"""

from __future__ import annotations

from typing import Any

_DIGEST = "5fbbd756f4b9058883a709dd275ec8519ccb2cced818cb19cf3be519ac677ce6"
_FILES = "/v1/adapters/support-bot/versions/1/files/"
_RULE = {"kind": "customer", "key": "alice", "adapter": "support-bot", "alias": "live",
         "tenant": "acme", "base_model": "tiny-llama"}


def json_example(example: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route: ``example`` as the example of its 200 answer."""
    return {200: {"content": {"application/json": {"example": example}}}}


EVENT_PAGE: dict[str, Any] = {
    "events": [
        {"type": "adapter_created", "tenant": "acme", "adapter": "support-bot",
         "time": "2026-11-29T06:32:34.978318+00:00", "base_model": "tiny-llama",
         "event_id": "bc12a55f-7403-47dc-8a6c-ab06db503e3f", "seq": 1},
        {"type": "route_changed", "tenant": "acme", "adapter": "support-bot",
         "time": "2026-11-29T06:32:40.638472+00:00", "kind": "customer", "key": "alice",
         "rule": _RULE, "route_revision": 1,
         "event_id": "d7060ffc-1668-4657-9d7f-344258e4add0", "seq": 4},
    ],
    "next_after": 4,
}

DESIRED_STATE: dict[str, Any] = {
    "base_model": "tiny-llama",
    "stream": "LORAPLANE",
    "stream_seq": 3,
    "event_seq": 4,
    "adapters": [{
        "tenant": "acme",
        "name": "support-bot",
        "base_model": "tiny-llama",
        "aliases": [{
            "alias": "live",
            "revision": 1,
            "target": {
                "adapter": "support-bot", "version": 1, "digest": _DIGEST,
                "base_model": "tiny-llama", "rank": 8, "alpha": 16.0,
                "target_modules": ["q_proj", "v_proj"],
                "files": [
                    {"name": "adapter_config.json", "size": 794,
                     "sha256": "5395ebb15079c41067111822b0533dfb2289ea0b0e1a31d7e73a12d85982e1ab",
                     "url": _FILES + "adapter_config.json"},
                    {"name": "adapter_model.safetensors", "size": 33808,
                     "sha256": "c0684958eb6a847bd2f7e832c6c0830d650cdf7ed579bcb4dd1abd3b2dde58a7",
                     "url": _FILES + "adapter_model.safetensors"},
                ],
            },
        }],
    }],
    "routes": [_RULE],
    "agents": [],
    "route_revisions": {"acme": 1},
}
