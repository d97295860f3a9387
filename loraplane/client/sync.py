"""``RegistryClient``: the registry's REST API, blocking, over one pooled connection."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

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
from loraplane.api.canaries import Canary, CanaryAnalysis, CanaryList, OnFailure
from loraplane.api.events import DEFAULT_PAGE
from loraplane.client import _calls as api
from loraplane.client._core import (
    DEFAULT_TIMEOUT_S,
    DOWNLOAD_CHUNK,
    Call,
    ClientConfig,
    FileCheck,
    OnBytes,
    Pager,
    registry_file_path,
)
from loraplane.client.config import DISCOVER, Discover
from loraplane.client.errors import RegistryError, error_from_transport
from loraplane.client.multipart import FilePart, OnProgress, check_first
from loraplane.client.retry import OnRetry, RetryDelay
from loraplane.events import AgentStatus, DesiredState, RouteKind
from loraplane.naming import DEFAULT_ALIAS

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - an item of a page
P = TypeVar("P", AdapterPage, VersionPage)


class RegistryClient:
    """The registry's REST API, blocking. Every failure is a ``RegistryError``.

    Without ``base_url`` or ``token``, they come from ``LORAPLANE_REGISTRY`` and
    ``LORAPLANE_TOKEN``, else the profile ``loraplane login`` saved
    (``loraplane.client.config``); ``token=None`` sends none.
    Use it as a context manager (or call ``close``). ``transport`` replaces the network,
    e.g. with ``httpx.MockTransport`` in tests.
    """

    def __init__(self, base_url: str | None = None, token: str | Discover | None = DISCOVER, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, user_agent: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.config = ClientConfig(base_url, token, timeout_s=timeout_s, user_agent=user_agent)
        try:
            self.http = httpx.Client(transport=transport, **self.config.http_options())
        except (httpx.InvalidURL, ValueError) as exc:
            raise self.config.invalid_url(exc) from exc

    @property
    def base_url(self) -> str:
        return self.config.base_url

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def send(self, call: Call[T]) -> T:
        """Send one call and parse its answer (the shells' one way to the network)."""
        content = iter(call.body) if call.body is not None else call.content
        headers = call.request_headers()
        timeout = self.config.timeout(call)
        try:
            response = self.http.request(
                call.method, call.url, params=call.params, json=call.json, content=content,
                headers=headers, timeout=timeout or httpx.USE_CLIENT_DEFAULT)
        except httpx.InvalidURL as exc:
            raise self.config.invalid_url(exc) from exc
        except httpx.TransportError as exc:
            raise error_from_transport(self.base_url, exc) from exc
        return self.config.finish(call, response)

    def _collect(self, page: Callable[[int, str | None], Call[P]],
                 items: Callable[[P], list[I]], limit: int | None, page_size: int) -> list[I]:
        pager: Pager[I] = Pager(limit, page_size)
        while (want := pager.want()) is not None:
            answer = self.send(page(want, pager.cursor))
            pager.add(items(answer), answer.next_cursor)
        return pager.result()

    # Adapters

    def create_adapter(self, name: str, base_model: str, *, tenant: str | None = None,
                       description: str | None = None,
                       replicas: int | None = None) -> AdapterOut:
        """Create adapter ``name`` (a slug) for ``base_model``; ``tenant`` defaults to the
        token's. ``replicas``: how many agents keep it hot (None: no placement)."""
        return self.send(api.create_adapter(name, base_model, tenant, description, replicas))

    def adapters_page(self, *, tenant: str | None = None, base_model: str | None = None,
                      limit: int | None = None, cursor: str | None = None) -> AdapterPage:
        return self.send(api.adapters_page(tenant, base_model, limit, cursor))

    def list_adapters(self, *, tenant: str | None = None, base_model: str | None = None,
                      limit: int | None = None, page_size: int = 100) -> list[AdapterOut]:
        """Every adapter the token sees (or the first ``limit``), over as many pages."""
        def page(want: int, cursor: str | None) -> Call[AdapterPage]:
            return api.adapters_page(tenant, base_model, want, cursor)
        return self._collect(page, lambda p: p.adapters, limit, page_size)

    def set_placement(self, name: str, replicas: int | None) -> AdapterOut:
        """Keep ``name`` hot on ``replicas`` agents (rendezvous placement); None clears
        it: every agent serving it loads it on demand."""
        return self.send(api.set_placement(name, replicas))

    def get_adapter(self, name: str) -> AdapterOut:
        return self.send(api.get_adapter(name))

    def delete_adapter(self, name: str) -> None:
        """Delete adapter ``name`` and its aliases; agents unload it."""
        self.send(api.delete_adapter(name))

    # Versions

    def push(self, name: str, source: Path | Sequence[FilePart], *,
             aliases: Sequence[str] = (), notes: str | None = None,
             on_progress: OnProgress | None = None,
             allow_shape_change: bool = False, abort_canary: bool = False) -> UploadResult:
        """Upload a PEFT folder or one archive as a version of ``name``, streamed from disk,
        and point ``aliases`` at it: by default none moves, storing a version is not
        serving it (``move_alias`` does that). Identical files are not a new version
        (``created`` is False). Tensor shapes unlike the adapter's current versions'
        are refused (``shape_mismatch``) unless ``allow_shape_change``; a canary running
        on an alias it moves refuses it (``canary_running``) unless ``abort_canary``. An
        adapter over 1 MiB is checked first, so an unknown name or a missing permission
        fails before its bytes are hashed and sent; a smaller one is refused by the
        upload itself."""
        if check_first(source):
            self.get_adapter(name)
        return self.send(api.push(name, source, aliases, notes, on_progress,
                                  allow_shape_change, abort_canary))

    def versions_page(self, name: str, *, limit: int | None = None,
                      cursor: str | None = None) -> VersionPage:
        return self.send(api.versions_page(name, limit, cursor))

    def list_versions(self, name: str, *, limit: int | None = None,
                      page_size: int = 100) -> list[VersionOut]:
        """The versions of ``name``, newest first: all of them, or the first ``limit``."""
        def page(want: int, cursor: str | None) -> Call[VersionPage]:
            return api.versions_page(name, want, cursor)
        return self._collect(page, lambda p: p.versions, limit, page_size)

    def get_version(self, name: str, version: int) -> VersionOut:
        return self.send(api.get_version(name, version))

    def download(self, url: str, dest: Path, *, size: int, sha256: str,
                 on_bytes: OnBytes | None = None) -> None:
        """Stream a file URL (a ``FileRef.url``) into ``dest``, checking size and sha256.

        Only a path on the registry is fetched (``registry_file_path``: the token goes
        nowhere else). A 307 to the blob store is followed without the bearer token
        (httpx drops it when a redirect leaves the registry's origin). On failure
        ``dest`` may be partly written: download into a staging place.
        """
        check = FileCheck(registry_file_path(url), dest, size, sha256, on_bytes)
        try:
            with self.http.stream("GET", check.url, follow_redirects=True) as response:
                if response.status_code != 200:
                    response.read()
                    raise check.refused(response)
                with dest.open("wb") as out:
                    for chunk in response.iter_bytes(DOWNLOAD_CHUNK):
                        out.write(check.feed(chunk))
        except httpx.HTTPError as exc:
            raise check.broken(exc) from exc
        check.finish()

    # Aliases

    def move_alias(self, name: str, alias: str, version: int, *,
                   abort_canary: bool = False,
                   expected_revision: int | None = None) -> AliasState:
        """Point ``alias`` at ``version`` (promote); with ``expected_revision``, only if
        the alias is still at that revision (else ``Conflict``). A canary running on
        the alias refuses the move (``canary_running``) unless ``abort_canary``."""
        return self.send(api.move_alias(name, alias, version, expected_revision,
                                         abort_canary))

    def rollback(self, name: str, alias: str = DEFAULT_ALIAS, *,
                 abort_canary: bool = False,
                 expected_revision: int | None = None) -> AliasState:
        """Move ``alias`` back to the version it pointed at before."""
        return self.send(api.rollback(name, alias, expected_revision, abort_canary))

    def delete_alias(self, name: str, alias: str, *,
                     abort_canary: bool = False) -> AliasState:
        return self.send(api.delete_alias(name, alias, abort_canary))

    def alias_history(self, name: str, alias: str = DEFAULT_ALIAS, *,
                      limit: int | None = None, cursor: str | None = None) -> AliasHistory:
        """The moves of ``alias``, newest first; pass a page's ``next_cursor`` as
        ``cursor`` for the older ones."""
        return self.send(api.alias_history(name, alias, limit, cursor))

    # Canaries

    def start_canary(self, name: str, version: int, *, alias: str = DEFAULT_ALIAS,
                     steps: Sequence[int] | None = None, step_seconds: int | None = None,
                     analysis: CanaryAnalysis | None = None,
                     on_failure: OnFailure | None = None) -> Canary:
        """Put ``version`` on ``steps[0]`` percent of ``alias``'s traffic; the registry
        judges each step and promotes or aborts it. Unset arguments take the registry's
        defaults."""
        return self.send(api.start_canary(name, alias, version, steps, step_seconds,
                                           analysis, on_failure))

    def get_canary(self, name: str, alias: str = DEFAULT_ALIAS) -> Canary:
        """The canary running on ``alias`` (``NotFound`` ``no_canary`` when none runs)."""
        return self.send(api.get_canary(name, alias))

    def pause_canary(self, name: str, alias: str = DEFAULT_ALIAS, *,
                     reason: str | None = None) -> Canary:
        return self.send(api.canary_action(name, alias, "pause", reason))

    def resume_canary(self, name: str, alias: str = DEFAULT_ALIAS, *,
                      reason: str | None = None) -> Canary:
        return self.send(api.canary_action(name, alias, "resume", reason))

    def promote_canary(self, name: str, alias: str = DEFAULT_ALIAS, *,
                       reason: str | None = None) -> Canary:
        """All traffic to the canary version now: the alias moves to it."""
        return self.send(api.canary_action(name, alias, "promote", reason))

    def abort_canary(self, name: str, alias: str = DEFAULT_ALIAS, *,
                     reason: str | None = None) -> Canary:
        """No traffic to the canary version; the alias stays where it was."""
        return self.send(api.canary_action(name, alias, "abort", reason))

    def list_canaries(self, name: str, alias: str = DEFAULT_ALIAS, *,
                      limit: int | None = None, cursor: str | None = None) -> CanaryList:
        """The canaries ``alias`` ran, newest first; pass ``next_cursor`` as ``cursor``."""
        return self.send(api.list_canaries(name, alias, limit, cursor))

    # Routing rules

    def list_routes(self, *, kind: RouteKind | None = None,
                    tenant: str | None = None) -> RouteList:
        """The routing rules the token may see: a tenant token's own; a global token's
        of every tenant, or of ``tenant``."""
        return self.send(api.list_routes(kind, tenant))

    def put_route(self, kind: RouteKind, key: str, adapter: str, *,
                  alias: str = DEFAULT_ALIAS, tenant: str | None = None) -> RouteOut:
        """Route requests whose ``kind`` header (customer, task) is ``key`` to
        ``adapter@alias``, a rule of the adapter's tenant. Kind ``default`` has the one
        key ``DEFAULT_ROUTE_KEY``. ``tenant``, if given, must be the adapter's."""
        return self.send(api.put_route(kind, key, adapter, alias, tenant))

    def delete_route(self, kind: RouteKind, key: str, *, tenant: str | None = None) -> None:
        """Delete a rule; a global token names the ``tenant`` when several have one."""
        self.send(api.delete_route(kind, key, tenant))

    # Tokens

    def create_token(self, name: str, role: Role | str, *,
                     tenant: str | None = None,
                     agent_id: str | None = None) -> TokenCreated:
        """A new token; its ``secret`` is in this answer only. ``agent_id`` binds an agent
        token to one agent id (else its first status report does)."""
        return self.send(api.create_token(name, role, tenant, agent_id))

    def whoami(self) -> TokenOut:
        """The token this client sends: its name, role and tenant (never its secret)."""
        return self.send(api.own_token())

    def list_tokens(self, *, include_revoked: bool = False) -> TokenList:
        return self.send(api.list_tokens(include_revoked))

    def revoke_token(self, token_id: int) -> None:
        self.send(api.revoke_token(token_id))

    # Events

    def events_page(self, *, after: int = 0, limit: int = DEFAULT_PAGE) -> EventPage:
        """The events with a sequence number above ``after`` (one page)."""
        return self.send(api.events_page(after, limit))

    def read_events(self, *, after: int = 0, limit: int = DEFAULT_PAGE) -> EventPage:
        """Up to ``limit`` events after ``after``, over as many pages as it takes."""
        events: list[dict[str, Any]] = []
        while len(events) < limit:
            page = self.events_page(after=after, limit=min(DEFAULT_PAGE, limit - len(events)))
            events.extend(page.events)
            after = max(after, page.next_after)
            if not page.events:
                break
        return EventPage(events=events, next_after=after)

    def follow_events(self, *, after: int = 0, interval_s: float = 1.0,
                      on_retry: OnRetry | None = None) -> Iterator[dict[str, Any]]:
        """Every event after ``after``, then each new one as it comes; never ends.

        A retryable failure (the registry restarting) is retried with backoff, telling
        ``on_retry`` (the error, and how many polls failed in a row; with None once
        a poll works again); any other failure is raised."""
        delay = RetryDelay()
        while True:
            try:
                page = self.events_page(after=after)
            except RegistryError as exc:
                time.sleep(delay.failed(exc, on_retry))
                continue
            delay.worked(on_retry)
            yield from page.events
            if page.next_after == after:
                time.sleep(interval_s)
            after = max(after, page.next_after)

    # The fleet and the agents' view

    def list_agents(self, *, base_model: str | None = None,
                    stale_after_s: float | None = None) -> AgentList:
        return self.send(api.list_agents(base_model, stale_after_s))

    def rollout(self, name: str, *, stale_after_s: float | None = None) -> RolloutOut:
        """How far each alias of ``name`` has rolled out across the fleet."""
        return self.send(api.rollout(name, stale_after_s))

    def report_status(self, status: AgentStatus) -> AgentOut:
        return self.send(api.report_status(status))

    def send_status(self, status: AgentStatus) -> None:
        """Store a report without reading it back (what an agent does on every change)."""
        self.send(api.send_status(status))

    def inference_credentials(self) -> InferenceCredentials:
        """Hash and tenant of every live inference token (an agent token's call)."""
        return self.send(api.inference_credentials())

    def desired(self, base_model: str, *, adapter: str | None = None) -> DesiredState:
        """What every agent of ``base_model`` should serve (the snapshot agents follow)."""
        return self.send(api.desired(base_model, adapter))
