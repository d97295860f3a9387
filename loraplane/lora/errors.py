"""The one exception every adapter check raises, with a machine-readable code."""

from __future__ import annotations

from typing import Any

ERROR_CODES: frozenset[str] = frozenset(
    {
        "missing_config",
        "invalid_config",
        "base_model_mismatch",
        "missing_weights",
        "invalid_safetensors",
        "safetensors_header_too_large",
        "safetensors_size_mismatch",
        "tensor_mismatch",
        "invalid_dtype",
        "non_finite_values",
        "rank_too_large",
        "target_module_unknown",
        "shape_mismatch",
        "file_too_large",
        "unsafe_archive",
        "archive_too_large",
        "archive_expansion_ratio",
        "unknown_file",
        "invalid_archive",
    }
)

# Refusals caused by a size limit rather than by bad content: the registry
# answers these with 413 so a client knows that retrying smaller can help.
TOO_LARGE_CODES: frozenset[str] = frozenset(
    {"safetensors_header_too_large", "file_too_large", "archive_too_large",
     "archive_expansion_ratio"}
)


class AdapterInvalid(Exception):
    """An adapter (or the archive carrying it) was refused.

    ``code`` is one of :data:`ERROR_CODES`, ``message`` is for humans and
    ``detail`` holds JSON-serialisable facts (tensor name, limits, ...).
    """

    code: str
    message: str
    detail: dict[str, Any]
    too_large: bool

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        if code not in ERROR_CODES:
            # An unknown code would leak to clients as an undocumented reason.
            raise ValueError(f"unknown AdapterInvalid code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = dict(detail) if detail else {}
        self.too_large = code in TOO_LARGE_CODES

    def to_dict(self) -> dict[str, Any]:
        """The body a service sends back for this refusal."""
        return {"code": self.code, "message": self.message, "detail": self.detail}

    def __reduce__(self) -> tuple[Any, ...]:
        # Keeps the exception picklable across process pools.
        return (type(self), (self.code, self.message, self.detail))
