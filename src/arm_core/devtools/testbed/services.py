"""The recognition services' side of NATS, as a test or a benchmark plays it: a client,
envelope builders (acks and results as the contract has them), a collector of
everything published on a subject, and an instant service that acks and answers every
request at once."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from arm_core.bridge.contracts import REQUEST_SCHEMA, validator


@dataclass
class Collector:
    """Everything published on a subject, as a real subscriber sees it."""

    messages: list[Msg] = field(default_factory=list)

    async def on_message(self, msg: Msg) -> None:
        self.messages.append(msg)

    def msg_ids(self) -> list[str]:
        return [(m.headers or {}).get("Nats-Msg-Id", "") for m in self.messages]

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(m.data) for m in self.messages]

    def assert_valid_requests(self) -> None:
        """Every request seen passes the request schema, and its header matches it."""
        for msg, body in zip(self.messages, self.bodies(), strict=True):
            validator(REQUEST_SCHEMA).validate(body)
            assert (msg.headers or {})["Nats-Msg-Id"] == f"{body['job_id']}:{body['attempt']}"
            expected = (
                "files.tabular_uploaded" if body["pipeline"] == "tabular" else "files.img_uploaded"
            )
            assert msg.subject == expected


async def collect(client: Client, subject: str) -> Collector:
    collector = Collector()
    await client.subscribe(subject, cb=collector.on_message)
    # Twice: nats-py's PING can overtake the pending SUB; the second PONG proves the SUB.
    await client.flush()
    await client.flush()
    return collector


async def nats_client(url: str) -> Client:
    return await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)


def envelope(
    job_id: uuid.UUID,
    file_id: uuid.UUID,
    status: str,
    service: str = "tabular-parser",
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema_version": "1.0",
        "job_id": str(job_id),
        "file_id": str(file_id),
        "status": status,
        "service": {"name": service, "version": "1.4.2"},
    }
    if status in ("done", "needs_check"):
        body["result_s3"] = {"bucket": "arm-ka", "key": f"results/{file_id}/{job_id}/result.json"}
        body["result_schema_version"] = "1.0"
    body.update(extra)
    return body


async def send(
    client: Client,
    body: dict[str, Any] | bytes,
    msg_id: str | None,
    subject: str = "files.tabular_parsed",
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    await client.publish(subject, data, headers={"Nats-Msg-Id": msg_id} if msg_id else None)
    await client.flush()  # twice, for the same reason as in collect()
    await client.flush()


@dataclass
class InstantService:
    """A recognition service that acks and answers `done` at once to every request, on
    a NATS connection of its own (what the burst tests and the benchmark need).

    With `answer_first` set, only that many requests are answered at once; the results
    of the others wait (their acks still go at once) until `release()`, so a test can
    land a fault with those answers still to come."""

    client: Client
    result_subject: str = "files.tabular_parsed"
    answered: int = 0
    answer_first: int | None = None
    held: list[tuple[bytes, str]] = field(default_factory=list)

    async def on_request(self, msg: Msg) -> None:
        request = json.loads(msg.data)
        job_id, file_id, attempt = request["job_id"], request["file_id"], request["attempt"]
        service = "tabular-parser" if request["pipeline"] == "tabular" else "scan-gateway"
        ack = envelope(uuid.UUID(job_id), uuid.UUID(file_id), "processing", service)
        done = envelope(uuid.UUID(job_id), uuid.UUID(file_id), "done", service)
        await self.client.publish(
            self.result_subject,
            json.dumps(ack).encode(),
            headers={"Nats-Msg-Id": f"ack:{job_id}:{attempt}"},
        )
        result = (json.dumps(done).encode(), f"result:{job_id}:{attempt}")
        if self.answer_first is not None and self.answered >= self.answer_first:
            self.held.append(result)
        else:
            await self._send(*result)
        self.answered += 1

    async def _send(self, data: bytes, msg_id: str) -> None:
        await self.client.publish(self.result_subject, data, headers={"Nats-Msg-Id": msg_id})

    async def release(self) -> int:
        """Sends every held result, in the order the requests came, and answers at once
        from then on; returns how many were held."""
        self.answer_first = None
        held, self.held = self.held, []
        for data, msg_id in held:
            await self._send(data, msg_id)
        await self.client.flush()
        await self.client.flush()  # the second PONG proves the server has them all
        return len(held)


async def instant_service(url: str, answer_first: int | None = None) -> InstantService:
    """Subscribes an InstantService to both request subjects; close its client when done."""
    service = InstantService(await nats_client(url), answer_first=answer_first)
    for subject in ("files.tabular_uploaded", "files.img_uploaded"):
        await service.client.subscribe(subject, cb=service.on_request)
    await service.client.flush()
    await service.client.flush()
    return service
