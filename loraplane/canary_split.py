"""Which version of an alias under canary serves a request: the sticky split.

A request's key (its customer, else the OpenAI ``user``) falls in one of 10,000 buckets
per canary, by a hash of the canary's id and the key; the canary version serves it iff
the bucket is below ``weight`` percent of them. So every agent assigns a key alike, a
key stays on one version while the weight holds, and as the weight grows a key only
moves from stable to canary. A new canary reshuffles the keys: the same customers are
not always the first to try a new version. A request with no key is drawn at random.
"""

from __future__ import annotations

import hashlib
import random

BUCKETS = 10_000


def bucket(key: str, canary_id: int) -> int:
    """The key's bucket in ``[0, BUCKETS)`` for this canary; the same on every agent and
    every release (agents of two releases may serve one canary side by side)."""
    digest = hashlib.blake2b(f"{canary_id}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def takes_canary(key: str | None, canary_id: int, weight: int) -> bool:
    """Whether the canary version serves a request of ``key`` at ``weight`` percent."""
    if weight <= 0:
        return False
    if weight >= 100:
        return True
    if key is None:
        return random.random() * 100 < weight
    return bucket(key, canary_id) < weight * (BUCKETS // 100)
