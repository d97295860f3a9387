"""What the running registry holds: settings, database, blob store, relay, metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loraplane.embedded_nats import EmbeddedNats
from registry_service.agents.convergence import FleetGauges
from registry_service.agents.fleet import FleetWatcher
from registry_service.agents.report_writer import ReportWriter
from registry_service.blobs.base import BlobStore
from registry_service.canaries.analyst import CanaryAnalyst
from registry_service.db.engine import Database
from registry_service.events.file_links import FileLinker
from registry_service.events.relay import EventRelay
from registry_service.metrics import RegistryMetrics
from registry_service.settings import RegistrySettings
from registry_service.versions.slots import UploadSlots

if TYPE_CHECKING:
    from registry_service.ui.stream import StreamHub


@dataclass
class RegistryContext:
    settings: RegistrySettings
    db: Database
    blobs: BlobStore
    relay: EventRelay
    metrics: RegistryMetrics
    reports: ReportWriter  # agents' status reports, many to a transaction
    fleet_gauges: FleetGauges  # the fleet's gauges, recomputed for scrapes
    embedded_nats: EmbeddedNats | None = None
    fleet: FleetWatcher | None = None
    analyst: CanaryAnalyst | None = None
    upload_slots: UploadSlots = field(default_factory=UploadSlots)
    # Adds presigned blob URLs to events and snapshots (None: LORAPLANE_EVENT_FILE_URLS
    # leaves them out); see events/file_links.py.
    file_linker: FileLinker | None = None
    # The /ui live streams and their one shared reader (ui/stream.py), from the first.
    ui_streams: StreamHub | None = None
