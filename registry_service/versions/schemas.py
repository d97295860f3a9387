"""The versions API's bodies: the wire contract lives in the shared core."""

from __future__ import annotations

from loraplane.api.versions import UploadResult, VersionOut, VersionPage

__all__ = ["UploadResult", "VersionOut", "VersionPage"]
