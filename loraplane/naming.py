"""Names shared by the registry and the agent.

Adapter and alias names are slugs, so they are safe in URLs, NATS subjects and
vLLM model names. Inside vLLM every version gets its own name, ``adapter@7``, and a
name is never reloaded with different weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# pydantic checks this pattern with Rust's regex, where ``$`` is the end of the text.
# Python's ``$`` also matches before a final newline, so Python code uses ``fullmatch``.
SLUG_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$"
_SLUG = re.compile(SLUG_PATTERN)
SLUG_RULE = ("1 to 63 lowercase letters, digits and hyphens, starting and ending with a "
             "letter or digit (e.g. support-bot)")
_SLUG_BODY = SLUG_PATTERN.removeprefix("^").removesuffix("$")
# Versions are 32-bit on the registry's side; a longer number names no version.
_MAX_VERSION = 2**31 - 1
DEFAULT_ALIAS = "live"


def is_slug(value: str) -> bool:
    return _SLUG.fullmatch(value) is not None


def explain_slug_error(message: str) -> str:
    """A validation message about a slug field in words: pydantic names the pattern
    ("String should match pattern '^[a-z0-9](?:...'"), which tells a person little."""
    if message.startswith("String should match pattern") and _SLUG_BODY in message:
        return f"a name holds {SLUG_RULE}"
    return message


def versioned_name(adapter: str, version: int) -> str:
    return f"{adapter}@{version}"


@dataclass(frozen=True, slots=True)
class ModelRef:
    """What a client asked for in ``model``: an adapter and an alias or a version."""

    adapter: str
    alias: str | None = None
    version: int | None = None

    @property
    def selector(self) -> str:
        if self.version is not None:
            return str(self.version)
        return self.alias or DEFAULT_ALIAS


def parse_model_ref(model: str) -> ModelRef | None:
    """Parse ``name``, ``name@alias`` or ``name@<version>``; None if it is no adapter ref."""
    name, sep, selector = model.partition("@")
    if not is_slug(name) or (sep and not selector):
        return None
    if not sep:
        return ModelRef(adapter=name, alias=DEFAULT_ALIAS)
    if selector.isdigit():
        # ``"²".isdigit()`` is true as well; only ASCII digits make a version number.
        if not selector.isascii() or len(selector) > len(str(_MAX_VERSION)):
            return None
        version = int(selector)
        return ModelRef(adapter=name, version=version) if version <= _MAX_VERSION else None
    if is_slug(selector):
        return ModelRef(adapter=name, alias=selector)
    return None
