"""Roles and the principal a request acts as."""

from __future__ import annotations

from dataclasses import dataclass

from loraplane.api.tokens import Role
from registry_service.errors import Forbidden

__all__ = ["Principal", "Role"]

_RANK = {Role.INFERENCE: 0, Role.READER: 1, Role.AGENT: 1, Role.PUBLISHER: 2, Role.ADMIN: 3}


@dataclass(frozen=True, slots=True)
class Principal:
    token_id: int
    name: str
    role: Role
    tenant_id: int | None
    tenant: str | None
    # The agent an agent token reports for, once bound (see agents/service.py).
    agent_id: str | None = None

    @property
    def is_global(self) -> bool:
        return self.tenant_id is None

    @property
    def is_global_admin(self) -> bool:
        return self.is_global and self.role is Role.ADMIN

    def require(self, role: Role) -> None:
        """Refuse unless this principal holds ``role`` or a higher one."""
        if self.role is Role.INFERENCE:
            # Inference tokens are for agents' OpenAI port; the registry grants them nothing.
            ok = False
        elif role is Role.AGENT:
            ok = self.role is Role.AGENT or self.is_global_admin
        else:
            ok = self.role is not Role.AGENT or role is Role.READER
            ok = ok and _RANK[self.role] >= _RANK[role]
        if not ok:
            raise Forbidden(
                f"this needs the {role.value} role; the token has {self.role.value}",
                code="insufficient_role",
                detail={"required": role.value, "actual": self.role.value},
            )

    def can_see(self, tenant_id: int) -> bool:
        return self.is_global or self.tenant_id == tenant_id
