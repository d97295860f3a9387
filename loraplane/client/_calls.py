"""Every call of the registry's REST API, built once for both shells (see ``_core``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loraplane.api import (
    AdapterOut,
    AdapterPage,
    AgentList,
    AgentOut,
    AliasHistory,
    AliasState,
    EventPage,
    Role,
    RolloutOut,
    RouteList,
    RouteOut,
    TokenCreated,
    TokenList,
    TokenOut,
    UploadResult,
    VersionOut,
    VersionPage,
)
from loraplane.api.agents import InferenceCredentials
from loraplane.api.canaries import Canary, CanaryAnalysis, CanaryList, CanaryVerb, OnFailure
from loraplane.api.events import DEFAULT_PAGE, EventKeyList
from loraplane.client._core import Call, model, nothing, path, query
from loraplane.client.multipart import (
    FieldPart,
    FilePart,
    MultipartBody,
    OnProgress,
    collect_files,
)
from loraplane.events import AgentStatus, DesiredState, RouteKind


def _body(**fields: Any) -> dict[str, Any]:
    """A JSON body without the optional fields left unset, so the registry's defaults hold."""
    return {k: v for k, v in fields.items() if v is not None}


# Adapters

def create_adapter(name: str, base_model: str, tenant: str | None,
                   description: str | None, replicas: int | None = None) -> Call[AdapterOut]:
    body = _body(name=name, base_model=base_model, tenant=tenant, description=description,
                 replicas=replicas)
    return Call("POST", path("adapters"), model(AdapterOut), json=body)


def set_placement(name: str, replicas: int | None) -> Call[AdapterOut]:
    # Sent even when None: a null clears the setting (no placement).
    return Call("PATCH", path("adapters", name), model(AdapterOut), json={"replicas": replicas})


def adapters_page(tenant: str | None, base_model: str | None, limit: int | None,
                  cursor: str | None) -> Call[AdapterPage]:
    params = query({"tenant": tenant, "base_model": base_model, "limit": limit,
                    "cursor": cursor})
    return Call("GET", path("adapters"), model(AdapterPage), params=params)


def get_adapter(name: str) -> Call[AdapterOut]:
    return Call("GET", path("adapters", name), model(AdapterOut))


def delete_adapter(name: str) -> Call[None]:
    return Call("DELETE", path("adapters", name), nothing)


# Versions

def push(name: str, source: Path | Sequence[FilePart], aliases: Sequence[str],
         notes: str | None, on_progress: OnProgress | None,
         allow_shape_change: bool = False, abort_canary: bool = False) -> Call[UploadResult]:
    files = collect_files(source) if isinstance(source, Path) else list(source)
    # Always sent, empty included: a body without it makes the registry move ``live``.
    fields = [FieldPart("aliases", ",".join(aliases))]
    if notes:
        fields.append(FieldPart("notes", notes))
    if allow_shape_change:
        fields.append(FieldPart("allow_shape_change", "true"))
    if abort_canary:
        fields.append(FieldPart("abort_canary", "true"))
    body = MultipartBody(fields, files, on_progress=on_progress)
    return Call("POST", path("adapters", name, "versions"), model(UploadResult), body=body,
                upload=True)


def versions_page(name: str, limit: int | None, cursor: str | None) -> Call[VersionPage]:
    return Call("GET", path("adapters", name, "versions"), model(VersionPage),
                params=query({"limit": limit, "cursor": cursor}))


def get_version(name: str, version: int) -> Call[VersionOut]:
    return Call("GET", path("adapters", name, "versions", version), model(VersionOut))


# Aliases

def move_alias(name: str, alias: str, version: int, expected_revision: int | None,
               abort_canary: bool = False) -> Call[AliasState]:
    body = _body(version=version, expected_revision=expected_revision,
                 abort_canary=abort_canary or None)
    return Call("PUT", path("adapters", name, "aliases", alias), model(AliasState), json=body)


def rollback(name: str, alias: str, expected_revision: int | None,
             abort_canary: bool = False) -> Call[AliasState]:
    body = _body(expected_revision=expected_revision, abort_canary=abort_canary or None) or None
    return Call("POST", path("adapters", name, "aliases", alias, "rollback"),
                model(AliasState), json=body)


def delete_alias(name: str, alias: str, abort_canary: bool = False) -> Call[AliasState]:
    return Call("DELETE", path("adapters", name, "aliases", alias), model(AliasState),
                params=query({"abort_canary": abort_canary or None}))


def alias_history(name: str, alias: str, limit: int | None,
                  cursor: str | None = None) -> Call[AliasHistory]:
    return Call("GET", path("adapters", name, "aliases", alias, "history"),
                model(AliasHistory), params=query({"limit": limit, "cursor": cursor}))


# Canaries

def start_canary(name: str, alias: str, version: int, steps: Sequence[int] | None,
                 step_seconds: int | None, analysis: CanaryAnalysis | None,
                 on_failure: OnFailure | None) -> Call[Canary]:
    body = _body(version=version, steps=list(steps) if steps else None,
                 step_seconds=step_seconds, on_failure=on_failure,
                 analysis=analysis.model_dump() if analysis else None)
    return Call("POST", path("adapters", name, "aliases", alias, "canary"), model(Canary),
                json=body)


def get_canary(name: str, alias: str) -> Call[Canary]:
    return Call("GET", path("adapters", name, "aliases", alias, "canary"), model(Canary))


def canary_action(name: str, alias: str, action: CanaryVerb,
                  reason: str | None) -> Call[Canary]:
    return Call("POST", path("adapters", name, "aliases", alias, "canary", action),
                model(Canary), json=_body(reason=reason))


def list_canaries(name: str, alias: str, limit: int | None,
                  cursor: str | None) -> Call[CanaryList]:
    return Call("GET", path("adapters", name, "aliases", alias, "canaries"), model(CanaryList),
                params=query({"limit": limit, "cursor": cursor}))


# Routing rules

def list_routes(kind: RouteKind | None, tenant: str | None) -> Call[RouteList]:
    return Call("GET", path("routes"), model(RouteList),
                params=query({"kind": kind, "tenant": tenant}))


def put_route(kind: RouteKind, key: str, adapter: str, alias: str,
              tenant: str | None) -> Call[RouteOut]:
    return Call("PUT", path("routes", kind, key), model(RouteOut),
                json={"adapter": adapter, "alias": alias}, params=query({"tenant": tenant}))


def delete_route(kind: RouteKind, key: str, tenant: str | None) -> Call[None]:
    return Call("DELETE", path("routes", kind, key), nothing, params=query({"tenant": tenant}))


# Tokens

def create_token(name: str, role: Role | str, tenant: str | None,
                 agent_id: str | None = None) -> Call[TokenCreated]:
    body = _body(name=name, role=str(role), tenant=tenant, agent_id=agent_id)
    return Call("POST", path("tokens"), model(TokenCreated), json=body)


def list_tokens(include_revoked: bool) -> Call[TokenList]:
    # The registry's default is to leave revoked tokens out: only say so when asked.
    params = query({"include_revoked": True if include_revoked else None})
    return Call("GET", path("tokens"), model(TokenList), params=params)


def own_token() -> Call[TokenOut]:
    return Call("GET", path("whoami"), model(TokenOut))


def revoke_token(token_id: int) -> Call[None]:
    return Call("DELETE", path("tokens", token_id), nothing)


# Events, the fleet, desired state

def events_page(after: int, limit: int = DEFAULT_PAGE) -> Call[EventPage]:
    return Call("GET", path("events"), model(EventPage),
                params=query({"after": after, "limit": limit}))


def list_agents(base_model: str | None, stale_after_s: float | None) -> Call[AgentList]:
    params = query({"base_model": base_model, "stale_after_s": stale_after_s})
    return Call("GET", path("agents"), model(AgentList), params=params)


def rollout(name: str, stale_after_s: float | None) -> Call[RolloutOut]:
    return Call("GET", path("adapters", name, "rollout"), model(RolloutOut),
                params=query({"stale_after_s": stale_after_s}))


def report_status(status: AgentStatus) -> Call[AgentOut]:
    return Call("POST", path("agents", status.agent_id, "status"), model(AgentOut),
                json=status.model_dump(mode="json"))


def send_status(status: AgentStatus) -> Call[None]:
    """``report_status`` with no answer body (RFC 7240 ``Prefer: return=minimal``): the
    registry answers 204, sparing both sides a copy of the whole report."""
    return Call("POST", path("agents", status.agent_id, "status"), nothing,
                content=status.model_dump_json().encode(),
                headers={"Prefer": "return=minimal", "Content-Type": "application/json"})


def inference_credentials() -> Call[InferenceCredentials]:
    return Call("GET", path("agents", "credentials"), model(InferenceCredentials))


def event_keys() -> Call[EventKeyList]:
    return Call("GET", path("events", "keys"), model(EventKeyList))


def desired(base_model: str, adapter: str | None) -> Call[DesiredState]:
    return Call("GET", path("desired"), model(DesiredState),
                params=query({"base_model": base_model, "adapter": adapter}))

