"""Probes of a recognition service that stopped answering (db/functions/22_pacing.sql).

While a paced pipeline's service is not answering, the paced claim lets one job out now
and then as a probe. The publisher sends it with a reply subject under this module's
inbox: when nobody subscribes to the request subject, the NATS server answers at once
with a 503 status (no responders; nats-py announces it supports them), ahead of the PONG
that confirms the batch. Then the batch is rolled back — the probe stays queued, nothing
was spent — the pipeline is held (arm.pace_unheard) and probed again a second later.
Once a service subscribes, the next probe reaches it and the pipeline answers again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.subscription import Subscription

from arm_core.bridge.config import BridgeConfig
from arm_core.rows import PacedJob, PublishedJob
from arm_core.store import Store

log = logging.getLogger(__name__)

# The status of the server's answer to a message with a reply subject and no subscriber.
NO_RESPONDERS_STATUS = "503"
# While nobody listens, the next probe after this long (it costs nothing but a publish).
UNHEARD_RETRY_SECONDS = 1.0


@dataclass(eq=False)
class Probes:
    config: BridgeConfig
    store: Store
    nats: Client
    _inbox: Subscription | None = None
    _prefix: str = ""
    _batches: int = 0
    # Request subjects nobody listened on at the last probe (logged once per outage).
    _unheard: set[str] = field(default_factory=set)

    async def replies(self, probes: frozenset[int]) -> dict[int, str]:
        """A reply subject per probe (by its index in the batch), unique to the batch."""
        if not probes:
            return {}
        if self._inbox is None:  # made once; nats-py keeps it across reconnects
            self._prefix = self.nats.new_inbox()
            self._inbox = await self.nats.subscribe(f"{self._prefix}.>")
        self._batches += 1
        return {i: f"{self._prefix}.{self._batches}.{i}" for i in probes}

    async def unheard(self, replies: dict[int, str]) -> set[int]:
        """The probes (by index) the server said nobody listens to. Called after the
        batch's PONG: the 503s came ahead of it, so they wait in the inbox now."""
        if not replies or self._inbox is None:
            return set()
        index = {reply: i for i, reply in replies.items()}
        unheard: set[int] = set()
        while self._inbox.pending_msgs:
            msg = await self._inbox.next_msg(timeout=1)
            status = (msg.headers or {}).get("Status")
            if msg.subject in index and status == NO_RESPONDERS_STATUS:
                unheard.add(index[msg.subject])
        return unheard

    async def hold(self, subjects: set[str]) -> None:
        """Nobody listens on `subjects`: their pipelines wait (the probe stays queued) and
        are probed again in a second, at no cost while nobody listens."""
        c = self.config.settings
        pipelines = {c.tabular_request_subject: "tabular", c.image_request_subject: "image"}
        for subject in sorted(subjects):
            if subject not in self._unheard:
                log.warning(
                    "nobody listens on %s: its jobs stay queued until a service subscribes",
                    subject,
                    extra={"action": "publish", "reason": "no_responders", "subject": subject},
                )
                self._unheard.add(subject)
            if subject in pipelines:
                await self.store.pace_unheard(pipelines[subject], UNHEARD_RETRY_SECONDS)

    def heard(self, claimed: list[PublishedJob]) -> None:
        """A probe went out to a subscriber: said once for a subject that had none."""
        for job in claimed:
            if isinstance(job, PacedJob) and job.probe and job.subject in self._unheard:
                self._unheard.discard(job.subject)
                log.info(
                    "a service listens on %s again",
                    job.subject,
                    extra={"action": "publish", "subject": job.subject},
                )
