"""The HTTP server of `arm-core serve` and `arm-core bridge`: aiohttp's AppRunner on a
TCPSite, configured through their documented options only (no subclass, no private
attribute), so an aiohttp release that keeps its documented API keeps what follows.

Slow clients are cut off by two deadlines:

* **headers** — aiohttp's ``keepalive_timeout`` is HTTP_HEADER_TIMEOUT_SECONDS: a
  connection that has not delivered a complete request line and headers within that
  time of its opening, or of the answer to its previous request, is closed, without an
  answer (aiohttp has no documented hook to send one). aiohttp applies it to a
  connection's first request since 3.14.4 (hence the floor in pyproject.toml). The same
  clock closes a keep-alive connection left idle.
* **body** — the handler that reads a body reads it within HTTP_BODY_TIMEOUT_SECONDS
  (arm_core.http.handlers): else a JSON 408 REQUEST_TIMEOUT and the connection is closed.
  A body no handler reads is read and thrown away after the answer for at most as long
  (aiohttp's ``lingering_time``); if it is still not complete, the connection is closed.

A request aiohttp cannot parse (a request line over MAX_LINE_BYTES, a header over
MAX_FIELD_BYTES, more than MAX_HEADERS headers, bytes that are not HTTP) is answered by
aiohttp itself before any middleware runs: ``400`` text/plain, connection closed.
aiohttp offers no documented way to reshape that answer; every request it parses gets
the API's JSON errors from the middlewares. Its log record, an ERROR whose exception
quotes the client's bytes (a header may be a credential), is turned by
:class:`UnparsableRequestLog` into one INFO line naming the parser's complaint by class.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.http import HttpProcessingError

from arm_core.config import Settings
from arm_core.http.keys import SETTINGS, SHUTDOWN

# The parser's limits (aiohttp's defaults, stated here so the documented numbers are ours).
MAX_LINE_BYTES = 8190
MAX_FIELD_BYTES = 8190
MAX_HEADERS = 128


class UnparsableRequestLog(logging.Filter):
    """On the logger aiohttp's connections log to (:data:`PROTOCOL_LOG`): a request its
    parser refused comes as an ERROR with a traceback whose text quotes the client's
    bytes. It becomes one INFO line (DEBUG where aiohttp chose DEBUG: TLS or garbage
    on the first request) with the parser's complaint by class only."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        record.levelno = min(record.levelno, logging.INFO)
        record.levelname = logging.getLevelName(record.levelno)
        record.exc_info, record.exc_text = None, None
        record.__dict__.update(action="http_bad_request", error=type(exc).__name__)
        return PROTOCOL_LOG.isEnabledFor(record.levelno)


PROTOCOL_LOG = logging.getLogger(f"{__name__}.protocol")
PROTOCOL_LOG.addFilter(UnparsableRequestLog())


def protocol_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments AppRunner documents for aiohttp's per-connection protocol."""
    return {
        "access_log": None,
        "logger": PROTOCOL_LOG,
        "keepalive_timeout": settings.http_header_timeout_seconds,
        "lingering_time": settings.http_body_timeout_seconds,
        "max_line_size": MAX_LINE_BYTES,
        "max_field_size": MAX_FIELD_BYTES,
        "max_headers": MAX_HEADERS,
    }


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str, port: int) -> AsyncIterator[tuple[str, int]]:
    """Starts `app` (its cleanup contexts: pool, bridge) and serves it on host:port;
    yields the address bound (port 0 → a free one). On exit, stops listening, lets
    requests in flight finish (aiohttp's 60 s, as web.run_app) and cleans the app up."""
    runner = web.AppRunner(app, **protocol_options(app[SETTINGS]))
    await runner.setup()
    try:
        # HTTPS when HTTP_TLS_CERT_FILE and HTTP_TLS_KEY_FILE are given (arm_core.tls).
        await web.TCPSite(runner, host, port, ssl_context=app[SETTINGS].https_context()).start()
        bound = runner.addresses[0]
        yield str(bound[0]), int(bound[1])
    finally:
        await runner.cleanup()


STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


def defer_stop_signals() -> None:
    """SIGINT and SIGTERM held back until run() can handle them: one that comes while
    the process imports and builds its application (it has logged its first line, so an
    orchestrator may send it) is then a clean stop, not death by the signal."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def run(app: web.Application, host: str, port: int) -> None:
    """`arm-core serve` and `arm-core bridge`: serve until SIGINT or SIGTERM (or until
    the app's SHUTDOWN is set: the bridge cannot go on), then stop cleanly (the cleanup
    contexts stop the bridge — the batch in flight commits or rolls back — and close the
    pool)."""

    async def main() -> None:
        stopping = app[SHUTDOWN]
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, stopping.set)
        # A stop that came while the process started (held back by defer_stop_signals)
        # is delivered now, to the handler: it starts, then stops cleanly.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        async with serving(app, host, port):
            await stopping.wait()

    asyncio.run(main())
