"""Setting up the results stream (RESULTS_STREAM): the JetStream stream that captures
the answers on RESULT_SUBJECT, and the one durable consumer every core instance fetches
from.

:func:`ensure_results_stream` creates the stream (:func:`wanted_stream`) or checks the
one there, setting the limits it owns and logging what differs;
:func:`results_consumer` makes the durable pull consumer the bridge's fetch loop
(bridge/stream_fetch.py) fetches with. Without RESULTS_STREAM none of this runs: answers
come over core NATS (bridge/nats_client.py, the connection itself).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from arm_core.config import Settings

# The NATS connection's logger (bridge/nats_client.py): every line about NATS, the
# connection's and the stream's, carries the same `logger` field.
log = logging.getLogger("arm_core.bridge.nats_client")


# Messages delivered to all instances together and not yet settled; past it the
# server delivers nothing more until some are acked. Above every instance's
# INBOX_BUFFER_SIZE plus a fetch.
STREAM_MAX_ACK_PENDING = 20_000


class StreamUnavailable(Exception):
    """RESULTS_STREAM cannot work with this server: the message names the variable."""


def _subject_matches(pattern: str, subject: str) -> bool:
    """Whether the stream subject `pattern` (with * and >) captures `subject`."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def wanted_stream(settings: Settings) -> StreamConfig:
    """The stream arm-core creates when RESULTS_STREAM does not exist yet, and the limits
    it sets on one it owns: interest retention (the stream holds only what is not
    applied yet), a byte limit with discard new (a full stream refuses a new answer
    rather than remove one not applied), a duplicate window shorter than
    ACK_TIMEOUT_SECONDS (an ack to a republished request is stored, not a duplicate)."""
    return StreamConfig(
        name=settings.results_stream,
        subjects=[settings.result_subject],
        storage=StorageType.FILE,
        num_replicas=settings.results_stream_replicas,
        retention=RetentionPolicy.INTEREST,
        discard=DiscardPolicy.NEW,
        max_bytes=settings.results_stream_max_bytes,
        max_age=settings.results_stream_max_age_seconds,
        duplicate_window=settings.duplicate_window_seconds,
    )


# The limits arm-core sets on a stream it owns (one that captures RESULT_SUBJECT and
# nothing else), in the order it changes them one by one; and what it only reports: the
# server cannot change a stream's storage, and a change of replicas moves the stream's
# data between nodes, the operator's call.
OWNED_LIMITS = ("retention", "discard", "max_bytes", "max_age", "duplicate_window")
REPORTED = ("storage", "num_replicas")


def _shown(name: str, value: Any) -> str:
    value = getattr(value, "value", value)
    if (name == "max_bytes" and value in (None, -1)) or (name == "max_age" and not value):
        return "unlimited"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _differs(name: str, have: StreamConfig, want: StreamConfig) -> bool:
    value, wanted = getattr(have, name), getattr(want, name)
    if name in ("max_age", "duplicate_window"):
        return abs((value or 0.0) - (wanted or 0.0)) >= 1e-6
    if name == "max_bytes":
        return (-1 if value is None else value) != wanted
    return bool(value != wanted)  # the server's strings equal nats-py's str enums


def _difference(name: str, have: StreamConfig, want: StreamConfig) -> str:
    value, wanted = (_shown(name, getattr(config, name)) for config in (have, want))
    shown = "replicas" if name == "num_replicas" else name
    return f"{shown} {value} (arm-core would use {wanted})"


def stream_differences(
    have: StreamConfig, want: StreamConfig, names: tuple[str, ...] = OWNED_LIMITS + REPORTED
) -> list[str]:
    """How an existing stream differs from the one arm-core would create, in `names`."""
    return [_difference(name, have, want) for name in names if _differs(name, have, want)]


async def _update_limits(js: JetStreamContext, have: StreamConfig, want: StreamConfig) -> list[str]:
    """Sets the OWNED_LIMITS of stream `have` to `want`'s: in one update, or one by one
    when the server refuses that (a server that cannot change the retention still gets
    the rest). Logs each change made; returns each difference left, with its reason."""
    changes = {n: getattr(want, n) for n in OWNED_LIMITS if _differs(n, have, want)}
    if not changes:
        return []
    made: list[str] = []
    refused: list[str] = []
    try:
        await js.update_stream(dataclasses.replace(have, **changes))
        made = list(changes)
    except (TimeoutError, NoRespondersError) as exc:  # a server refusing silently: no try
        reason = (
            f"no answer to the update ({type(exc).__name__}): is the user allowed "
            f"$JS.API.STREAM.UPDATE.{have.name}?"
        )
        refused = [f"{_difference(n, have, want)}: {reason}" for n in changes]
    except APIError:
        current = have
        for n, value in changes.items():
            try:
                await js.update_stream(dataclasses.replace(current, **{n: value}))
            except APIError as exc:
                reason = exc.description or str(exc)
                said = f"the server refused the change ({reason})"
                refused.append(f"{_difference(n, have, want)}: {said}")
                continue
            current = dataclasses.replace(current, **{n: value})
            made.append(n)
    for n in made:
        log.info(
            "updated JetStream stream %s: %s from %s to %s",
            have.name,
            n,
            _shown(n, getattr(have, n)),
            _shown(n, changes[n]),
            extra={"action": "stream_updated"},
        )
    return refused


async def ensure_results_stream(nc: Client, settings: Settings) -> JetStreamContext:
    """Makes sure the stream RESULTS_STREAM captures RESULT_SUBJECT: creates it when it
    does not exist. An existing stream that captures RESULT_SUBJECT and nothing else is
    arm-core's: its OWNED_LIMITS are set to the configuration; one that captures more is
    the operator's, used as it is. What differs is logged. Raises StreamUnavailable when
    the server has no JetStream, refuses to create the stream, or the existing stream
    does not capture RESULT_SUBJECT."""
    name, subject = settings.results_stream, settings.result_subject
    js = nc.jetstream(timeout=5)
    want = wanted_stream(settings)
    for _ in range(3):  # two instances may create it at the same moment
        try:
            info = await js.stream_info(name)
        except (ServiceUnavailableError, NoRespondersError):
            raise StreamUnavailable(
                f"RESULTS_STREAM: the NATS server has no JetStream (start nats-server with "
                f"-js, or leave RESULTS_STREAM unset to receive answers without it); "
                f"stream {name!r} cannot be used"
            ) from None
        except NotFoundError:
            try:
                await js.add_stream(want)
            except APIError as exc:
                if "already in use" in str(exc) or exc.err_code == 10058:
                    continue  # another instance made it: read it as it is
                raise StreamUnavailable(
                    f"RESULTS_STREAM: the server refused to create stream {name!r} over "
                    f"{subject!r}: {exc}"
                ) from None
            log.info(
                "created JetStream stream %s over %s (file storage, %d replicas, interest "
                "retention, at most %d bytes with discard new, max age %g s, duplicate "
                "window %g s)",
                name,
                subject,
                want.num_replicas,
                want.max_bytes,
                want.max_age,
                want.duplicate_window,
                extra={"action": "stream_created"},
            )
            return js
        have = info.config
        if not any(_subject_matches(p, subject) for p in have.subjects or []):
            raise StreamUnavailable(
                f"RESULTS_STREAM: stream {name!r} exists but does not capture "
                f"{subject!r} (its subjects: {', '.join(have.subjects or []) or 'none'})"
            )
        if list(have.subjects or []) == [subject]:
            differences = await _update_limits(js, have, want)
            differences += stream_differences(have, want, REPORTED)
            said = f"JetStream stream {name}: what arm-core does not or could not change"
        else:
            differences = stream_differences(have, want)
            said = (
                f"JetStream stream {name} captures more than {subject}, so arm-core uses it "
                "as it is (its limits would act on the other subjects' messages too); it"
            )
        if differences:
            log.warning(
                "%s differs from the configuration: %s",
                said,
                "; ".join(differences),
                extra={"action": "stream_differs"},
            )
        else:
            log.info("using JetStream stream %s", name, extra={"action": "stream_found"})
        return js
    raise StreamUnavailable(f"RESULTS_STREAM: stream {name!r} could neither be read nor made")


async def results_consumer(
    js: JetStreamContext,
    settings: Settings,
    pending_bytes_limit: int = 32 << 20,
) -> Any:
    """The one durable pull consumer (named NATS_QUEUE_GROUP) that every core instance
    fetches from, `pending_bytes_limit` bounding nats-py's queue of it. Warns when the
    stream has other consumers: with interest retention one that reads nothing (the
    consumer of an earlier NATS_QUEUE_GROUP, an operator's) keeps every answer."""
    durable = settings.nats_queue_group
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=settings.stream_ack_wait_seconds,
        max_ack_pending=STREAM_MAX_ACK_PENDING,
        max_deliver=-1,
        filter_subject=settings.result_subject,
    )
    try:
        consumer = await js.pull_subscribe(
            settings.result_subject,
            durable=durable,
            stream=settings.results_stream,
            config=config,
            pending_bytes_limit=pending_bytes_limit,
        )
    except APIError as exc:
        raise StreamUnavailable(
            f"RESULTS_STREAM: the server refused the durable consumer {durable!r} on "
            f"stream {settings.results_stream!r}: {exc}"
        ) from None
    try:
        info = await js.stream_info(settings.results_stream)
    except Exception as exc:  # only a warning's worth: the consumer is there
        log.debug("stream info of %s: %s", settings.results_stream, exc)
        return consumer
    others = (info.state.consumer_count or 0) - 1
    if others > 0 and info.config.retention == RetentionPolicy.INTEREST:
        log.warning(
            "JetStream stream %s has %d consumer(s) besides %s: with interest retention it "
            "keeps every message until each consumer has acked it, so one that reads "
            "nothing fills the stream until it refuses new answers; remove any that is not "
            "in use (nats consumer rm %s <name>)",
            settings.results_stream,
            others,
            durable,
            settings.results_stream,
            extra={"action": "stream_consumers"},
        )
    return consumer
