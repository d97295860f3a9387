"""The registry's FastAPI application and its lifespan."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from loraplane import __version__
from loraplane.loop_lag import LoopLagMonitor, lag_histogram
from loraplane.nats_auth import describe_nats
from registry_service.adapters.routes import retired_names
from registry_service.adapters.routes import router as adapters_router
from registry_service.agents.convergence import FleetGauges
from registry_service.agents.fleet import FleetWatcher
from registry_service.agents.report_writer import ReportWriter
from registry_service.agents.routes import router as agents_router
from registry_service.aliases.routes import router as aliases_router
from registry_service.api.body_limit import BodyLimitMiddleware
from registry_service.api.docs import install_docs
from registry_service.api.errors import install_error_handlers
from registry_service.api.health import router as health_router
from registry_service.api.metrics import MetricsMiddleware
from registry_service.api.openapi import install_openapi
from registry_service.auth.routes import router as tokens_router
from registry_service.auth.routes import whoami_router
from registry_service.blobs.gc import BlobCollector
from registry_service.blobs.routes import router as blobs_router
from registry_service.bootstrap import (
    build_blobs,
    prepare_data_dir,
    prepare_database,
    start_embedded_nats,
)
from registry_service.canaries.analyst import CanaryAnalyst
from registry_service.canaries.routes import router as canaries_router
from registry_service.canaries.webhooks import webhook_secret
from registry_service.context import RegistryContext
from registry_service.desired.routes import router as desired_router
from registry_service.events.file_links import event_file_linker
from registry_service.events.relay import EventRelay
from registry_service.events.routes import router as events_router
from registry_service.events.signing import event_signer
from registry_service.metrics import RegistryMetrics
from registry_service.routing.routes import router as routing_router
from registry_service.settings import RegistrySettings
from registry_service.ui.routes import install_ui
from registry_service.versions.routes import router as versions_router

log = logging.getLogger(__name__)
LOOP_LAG_METRIC = "loraplane_registry_event_loop_lag_seconds"
TITLE = "loraplane registry"
DESCRIPTION = (
    "The registry of LoRA adapters served by vLLM: adapters and their immutable versions, "
    "the aliases that point at them, routing rules, tokens, and the agents' reports. "
    "Every call but /healthz, /readyz and /metrics needs a bearer token; every refusal "
    "has one body, "
    "`{\"error\": {\"code\", \"message\", \"detail\"}}`, with a machine-readable `code`.")


@asynccontextmanager
async def _run(app: FastAPI, settings: RegistrySettings) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        # First in, last out: start-up and shutdown work on the loop is measured too.
        await stack.enter_async_context(app.state.loop_lag.running())
        prepare_data_dir(settings)
        nats = await start_embedded_nats(settings)
        if nats is not None:
            stack.push_async_callback(nats.stop_async)
        db = await prepare_database(settings)
        stack.push_async_callback(db.close)
        blobs = build_blobs(settings)
        stack.push_async_callback(blobs.close)
        collector = BlobCollector(db, blobs, settings, app.state.metrics)
        await collector.start()
        stack.push_async_callback(collector.stop)
        metrics: RegistryMetrics = app.state.metrics
        # The embedded nats-server listens on loopback only; the registry connects to it
        # as its user "registry" (loraplane/nats_permissions.py).
        nats_url = nats.url if nats is not None else str(settings.nats_url)
        security = settings.nats_security if nats is None else nats.security()
        # "auto" adds presigned URLs to events only on an external NATS (file_links.py).
        linker = event_file_linker(settings, blobs,
                                   settings.nats_security if nats is None else None)
        relay = EventRelay(db, nats_url, settings=settings, metrics=metrics, security=security,
                           linker=linker, signer=event_signer(settings))
        db.on_outbox_commit(relay.notify)
        await relay.start()
        stack.push_async_callback(relay.stop)
        fleet = FleetWatcher(db, settings.agent_stale_after_s)
        await fleet.start()
        stack.push_async_callback(fleet.stop)
        analyst = CanaryAnalyst(db, interval_s=settings.canary_interval_s,
                                lease_s=settings.canary_lease_s,
                                secret=lambda: webhook_secret(settings),
                                prometheus_url=settings.prometheus_url,
                                on_judged=lambda judged: metrics.count_judged(judged.outcome))
        await analyst.start()
        stack.push_async_callback(analyst.stop)
        reports = ReportWriter(db, stale_after_s=settings.agent_stale_after_s,
                               fleet_note=fleet.noted, on_batch=metrics.report_batch.observe)
        await reports.start()
        stack.push_async_callback(reports.stop)
        app.state.ctx = RegistryContext(settings=settings, db=db, blobs=blobs, relay=relay,
                                        metrics=metrics, reports=reports,
                                        fleet_gauges=FleetGauges(
                                            db, metrics,
                                            stale_after_s=settings.agent_stale_after_s,
                                            max_age_s=settings.fleet_metrics_max_age_s),
                                        embedded_nats=nats, fleet=fleet, analyst=analyst,
                                        file_linker=linker)
        log.info("registry ready (database %s, blobs %s, nats %s)",
                 db.engine.dialect.name, settings.blob_kind, describe_nats(nats_url, security))
        # What start-up built lives as long as the registry: kept out of the cyclic
        # collector's full passes, which walk every object with the GIL held and so hold
        # the loop (docs/operations.md, "The event loop is held").
        gc.freeze()
        stack.callback(gc.unfreeze)
        yield


def create_app(settings: RegistrySettings | None = None) -> FastAPI:
    settings = settings or RegistrySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with _run(app, settings):
            yield

    app = FastAPI(title=TITLE, version=__version__, description=DESCRIPTION,
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    # Its own /docs and /redoc: every asset from the registry, none from a CDN.
    install_docs(app, TITLE)
    app.state.metrics = RegistryMetrics(settings.metrics_max_adapters)
    app.state.loop_lag = LoopLagMonitor(
        lag_histogram(app.state.metrics.registry, LOOP_LAG_METRIC),
        interval_s=settings.loop_lag_interval_s, warn_after_s=settings.loop_lag_warn_s,
        switch_interval_s=settings.gil_switch_interval_s)
    # Inside the metrics middleware (added after it), so its 413s are counted.
    app.add_middleware(BodyLimitMiddleware, limit=lambda: settings.max_json_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    install_error_handlers(app)
    for router in (health_router, adapters_router, retired_names, versions_router,
                   aliases_router, canaries_router,
                   routing_router, events_router, desired_router, agents_router,
                   tokens_router, whoami_router, blobs_router):
        app.include_router(router)
    install_ui(app)
    install_openapi(app)
    return app
