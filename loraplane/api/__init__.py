"""The registry's REST contract: the request and response bodies of ``/v1``.

The registry declares its routes with these models and the Python client
(``loraplane.client``) parses its answers with them, so the contract is written once
and checked on both sides, as ``loraplane.events`` is for events. Like that module,
this package imports nothing but pydantic and the standard library.
"""

from __future__ import annotations

from loraplane.api.adapters import (
    AdapterCreate,
    AdapterOut,
    AdapterPage,
    AdapterUpdate,
    AliasOut,
)
from loraplane.api.agents import AgentList, AgentOut, AliasRollout, RolloutEntry, RolloutOut
from loraplane.api.aliases import (
    AliasHistory,
    AliasMoveOut,
    AliasMoveRequest,
    AliasState,
    RollbackRequest,
)
from loraplane.api.errors import ErrorBody, ErrorInfo
from loraplane.api.events import EventPage
from loraplane.api.routing import RouteList, RouteOut, RoutePut
from loraplane.api.tokens import Role, TokenCreate, TokenCreated, TokenList, TokenOut
from loraplane.api.versions import UploadResult, VersionOut, VersionPage

__all__ = [
    "AdapterCreate",
    "AdapterOut",
    "AdapterPage",
    "AdapterUpdate",
    "AgentList",
    "AgentOut",
    "AliasHistory",
    "AliasMoveOut",
    "AliasMoveRequest",
    "AliasOut",
    "AliasRollout",
    "AliasState",
    "ErrorBody",
    "ErrorInfo",
    "EventPage",
    "Role",
    "RollbackRequest",
    "RolloutEntry",
    "RolloutOut",
    "RouteList",
    "RouteOut",
    "RoutePut",
    "TokenCreate",
    "TokenCreated",
    "TokenList",
    "TokenOut",
    "UploadResult",
    "VersionOut",
    "VersionPage",
]
