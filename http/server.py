"""The HTTP server of `arm-core serve` and `arm-core bridge`: aiohttp's AppRunner on a
TCPSite, through their documented options only. How it answers slow and malformed
clients (the header and body deadlines, the parser's limits): http/README.md "What
answers a client that misbehaves". aiohttp applies ``keepalive_timeout`` to a
connection's first request since 3.14.4 (hence the floor in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.http import HttpProcessingError

from arm_core.http.keys import SETTINGS, SHUTDOWN


def _unparsable_request(record: logging.LogRecord) -> bool:
    """A request aiohttp's parser refused is logged as an ERROR whose traceback quotes
    the client's bytes (a header may be a credential): it becomes one INFO line (DEBUG
    where aiohttp chose DEBUG) naming the parser's complaint by class only."""
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, HttpProcessingError):
        return True
    record.levelno = min(record.levelno, logging.INFO)
    record.levelname = logging.getLevelName(record.levelno)
    record.exc_info, record.exc_text = None, None
    record.__dict__.update(action="http_bad_request", error=type(exc).__name__)
    return PROTOCOL_LOG.isEnabledFor(record.levelno)


PROTOCOL_LOG = logging.getLogger(f"{__name__}.protocol")
PROTOCOL_LOG.addFilter(_unparsable_request)


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str, port: int) -> AsyncIterator[tuple[str, int]]:
    """Starts `app` (its cleanup contexts: pool, bridge) and serves it on host:port;
    yields the address bound (port 0 → a free one). On exit, stops listening, lets
    requests in flight finish (aiohttp's 60 s, as web.run_app) and cleans the app up."""
    settings = app[SETTINGS]
    runner = web.AppRunner(
        app,
        access_log=None,
        logger=PROTOCOL_LOG,
        # A request's line and headers, or the next request, within this; else closed.
        keepalive_timeout=settings.http_header_timeout_seconds,
        # A body no handler read is read and dropped for at most this long.
        lingering_time=settings.http_body_timeout_seconds,
        # The parser's limits: aiohttp's defaults, stated so the documented numbers are ours.
        max_line_size=8190,
        max_field_size=8190,
        max_headers=128,
    )
    await runner.setup()
    try:
        # HTTPS when HTTP_TLS_CERT_FILE and HTTP_TLS_KEY_FILE are given (arm_core.tls).
        await web.TCPSite(runner, host, port, ssl_context=settings.https_context()).start()
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
    """Serves `app` until SIGINT, SIGTERM or its SHUTDOWN (the bridge cannot go on),
    then stops cleanly: the cleanup contexts stop the bridge and close the pool."""

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
