"""The canary analyst: the registry's loop that judges each running canary's steps.

Every ``interval_s`` it leases the progressing canaries to itself (``analyst``,
``analyst_until``, as the outbox relay leases its rows): those no one holds, those
whose lease ran out, and its own, renewed. Of those, each whose step is due is judged
(``judge.py``), one transaction each. With several replicas one analyst holds a canary
until it stops renewing; a restarted registry finds every canary as it was left and
goes on (the step's window is in the database, not here). Webhook gates are called
from here, with no transaction open (webhooks.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import or_, update
from sqlalchemy.exc import SQLAlchemyError

from loraplane.api.canaries import CanaryCheck, GatePhase
from registry_service.background import BackgroundTask
from registry_service.canaries.judge import Judged, Measured, Seen, due, judge, seen
from registry_service.canaries.models import CanaryRow
from registry_service.canaries.prometheus import (
    PrometheusFailed,
    PrometheusSource,
    unavailable,
    uses_prometheus,
)
from registry_service.canaries.webhooks import run_gates, webhook_client
from registry_service.db.base import as_utc, utcnow
from registry_service.db.engine import Database
from registry_service.errors import RegistryError
from registry_service.events.relay import relay_identity

log = logging.getLogger(__name__)


class CanaryAnalyst(BackgroundTask):
    task_name = "canary-analyst"

    def __init__(self, db: Database, *, interval_s: float, lease_s: float,
                 secret: Callable[[], bytes] = lambda: b"",
                 prometheus_url: str | None = None,
                 on_judged: Callable[[Judged], None] | None = None) -> None:
        """``secret`` gives the key webhook gates are signed with (asked at the first
        call: the file behind it is only made when a canary has gates)."""
        self._db = db
        self._secret = secret
        self._secret_value: bytes | None = None
        self._http = webhook_client()
        self._prometheus = (PrometheusSource(prometheus_url, self._http)
                            if prometheus_url is not None else None)
        self.interval_s = interval_s
        self.lease_s = lease_s
        self.identity = relay_identity()
        self._on_judged = on_judged
        self.judged = 0

    async def tick(self) -> list[Judged]:
        """Lease what is free or ours, and judge each step that is due."""
        out: list[Judged] = []
        for canary_id in await self._lease():
            outcome = await self._judge(canary_id)
            if outcome is not None:
                log.info("canary %d: %s: %s", canary_id, outcome.next, outcome.reason)
                out.append(outcome)
                if self._on_judged is not None:
                    self._on_judged(outcome)
        self.judged += len(out)
        return out

    async def _judge(self, canary_id: int) -> Judged | None:
        """Read the canary, call its gates and Prometheus with no transaction open,
        then judge."""
        async with self._db.session() as session:
            was = await seen(session, canary_id)
        if was is None:
            return None
        measured = await self._measure(was)
        async with self._db.session() as session:
            return await judge(session, was, measured, analyst=self.identity, now=utcnow())

    async def _measure(self, was: Seen) -> Measured:
        canary = was.canary
        found: list[CanaryCheck] = []
        if canary.analysis.webhooks:
            phase: GatePhase = "pre" if canary.step == 0 else "step"
            found += await run_gates(self._http, canary, phase, self._key())
        prometheus = self._prometheus
        if canary.step == 0 or prometheus is None:
            return Measured(found)
        seconds = (utcnow() - as_utc(was.window_started_at)).total_seconds()
        found += await prometheus.checks(canary, seconds)
        if not uses_prometheus(canary, configured=True):
            return Measured(found)
        try:
            return Measured(found, await prometheus.sides(canary, seconds))
        except PrometheusFailed as exc:
            return Measured([*found, unavailable(str(exc))])

    def _key(self) -> bytes:
        if self._secret_value is None:
            self._secret_value = self._secret()
        return self._secret_value

    async def _lease(self) -> list[int]:
        """The ids of the progressing canaries this analyst now holds whose step is due."""
        now = utcnow()
        async with self._db.session() as session:
            rows = (await session.execute(
                update(CanaryRow)
                .where(CanaryRow.state == "progressing",
                       or_(CanaryRow.analyst_until.is_(None), CanaryRow.analyst_until <= now,
                           CanaryRow.analyst == self.identity))
                .values(analyst=self.identity,
                        analyst_until=now + timedelta(seconds=self.lease_s))
                .returning(CanaryRow.id, CanaryRow.step, CanaryRow.step_started_at,
                           CanaryRow.step_seconds)
                .execution_options(synchronize_session=False))).all()
            await session.commit()
        return sorted(row.id for row in rows
                      if due(row.step, row.step_started_at, row.step_seconds, now))

    async def release(self) -> None:
        """Hand every lease back, so another replica goes on at once."""
        async with self._db.session() as session:
            await session.execute(
                update(CanaryRow).where(CanaryRow.analyst == self.identity)
                .values(analyst=None, analyst_until=None)
                .execution_options(synchronize_session=False))
            await session.commit()

    async def stop(self) -> None:
        await super().stop()
        await self._http.aclose()
        try:
            await self.release()
        except (SQLAlchemyError, OSError) as exc:
            log.warning("canary analyst: leases not handed back (%s); they run out", exc)

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except (RegistryError, SQLAlchemyError) as exc:
                log.warning("canary analyst: %s; trying again later", exc)
            await asyncio.sleep(self.interval_s)
