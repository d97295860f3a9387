"""Imports every model so ``Base.metadata`` is complete (Alembic, tests)."""

from registry_service.adapters.models import Adapter
from registry_service.agents.models import AgentRow
from registry_service.aliases.models import Alias, AliasMove
from registry_service.auth.models import ApiToken
from registry_service.blobs.models import BlobLease
from registry_service.canaries.models import CanaryRow, CanaryTrafficRow
from registry_service.db.base import Base
from registry_service.events.models import EventRow
from registry_service.routing.models import RouteRuleRow
from registry_service.tenants.models import Tenant
from registry_service.versions.models import Version

__all__ = [
    "Adapter",
    "AgentRow",
    "Alias",
    "AliasMove",
    "ApiToken",
    "Base",
    "BlobLease",
    "CanaryRow",
    "CanaryTrafficRow",
    "EventRow",
    "RouteRuleRow",
    "Tenant",
    "Version",
]
