"""The HTTP server of `arm-core serve` and `arm-core bridge`: aiohttp's, with the answers
aiohttp gives by itself in the API's JSON shape and with deadlines for slow clients.

aiohttp answers a request it cannot parse (a request line or a header over 8,190 bytes,
more than 128 headers, bytes that are not HTTP) before any middleware runs, as
text/plain. :class:`ArmRequestHandler`, a subclass of aiohttp's per-connection protocol,
answers those as {"error": {"code", "message"}} with the fitting status (414 URI_TOO_LONG,
431 HEADER_TOO_LARGE, 400 BAD_REQUEST) and holds two deadlines:

* **headers** — a request's line and headers must be complete within
  HTTP_HEADER_TIMEOUT_SECONDS of its first byte (of the connection's opening, for the
  first request): else a JSON 408 and the connection is closed;
* **body** — its body must be complete within HTTP_BODY_TIMEOUT_SECONDS of its headers:
  else the handler reading it gets :class:`~arm_core.http.errors.RequestTimeout` (a JSON
  408, the connection closed); a handler that does not read it answers as it would, and
  the connection is then closed.

A keep-alive connection idle between two requests is closed after KEEPALIVE_SECONDS (what
`web.run_app` used). That clock also bounds the one case the header deadline cannot see:
a pipelined request whose first bytes came in the same packet as the end of the one
before (the parser, which holds them, does not say so).

Messages name the limit and the variable, never what the client sent (a header may be a
credential).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, LineTooLong
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from aiohttp.web_request import BaseRequest

from arm_core.http.errors import RequestTimeout, error_response
from arm_core.runtime import SETTINGS

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 75.0
# In-flight requests get this long to finish at SIGTERM (web.run_app's default).
SHUTDOWN_SECONDS = 60.0


class HeaderTimeout(Exception):
    """A request's line and headers did not arrive in time (the 408 of the header
    deadline travels through aiohttp's error path as this)."""


class ArmRequestHandler(RequestHandler):
    """aiohttp's protocol for one connection, plus JSON errors and the two deadlines.

    It hooks the documented points of RequestHandler — connection_made, data_received,
    connection_lost, handle_error, log_exception — and delivers the header deadline's 408
    the way aiohttp delivers a parse error: an error message queued for the connection's
    request loop, which then answers it and closes."""

    def __init__(
        self, manager: web.Server, *, header_timeout: float, body_timeout: float, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout = header_timeout
        self._body_timeout = body_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None  # the body still arriving, if any
        self._line_bytes = 0  # bytes of the pending request's first line so far
        self._line_complete = False  # its first line has ended (a long line is a header)
        self._timed_out = False  # answered 408: what else arrives is dropped

    # --- connection events ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_header_clock()

    def data_received(self, data: bytes) -> None:
        if self._timed_out:
            return
        if self._body is None and data:
            if self._header_timer is None:
                self._start_header_clock()  # the first byte of the next request
            self._count_line(data)
        before = self._request_count
        super().data_received(data)
        parsed = self._request_count - before
        if parsed:
            self._stop_header_clock()
            for message, payload in list(self._messages)[-parsed:]:
                if not isinstance(message, _ErrInfo) and not payload.is_eof():
                    self._start_body_clock(payload)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_clock()
        self._stop_body_clock()
        super().connection_lost(exc)

    # --- the header deadline -------------------------------------------------------

    def _start_header_clock(self) -> None:
        self._line_bytes, self._line_complete = 0, False
        self._header_timer = self._loop.call_later(self._header_timeout, self._header_late)

    def _stop_header_clock(self) -> None:
        # The line counts stay: handle_error reads them when the parser has just failed.
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _count_line(self, data: bytes) -> None:
        if not self._line_complete:
            end = data.find(b"\n")
            self._line_bytes += len(data) if end < 0 else end
            self._line_complete = end >= 0

    def _header_late(self) -> None:
        self._header_timer = None
        if self._force_close or self._close or self.transport is None:
            return
        self._timed_out = True
        log.info(
            "request line and headers not received within HTTP_HEADER_TIMEOUT_SECONDS=%g; "
            "answering 408 and closing",
            self._header_timeout,
            extra={"action": "http_timeout"},
        )
        # The request loop answers it like a parse error: handle_error, then close.
        error = HeaderTimeout("request line and headers not received in time")
        self._messages.append((_ErrInfo(status=408, exc=error, message=""), EMPTY_PAYLOAD))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # --- the body deadline ---------------------------------------------------------

    def _start_body_clock(self, payload: StreamReader) -> None:
        self._stop_body_clock()
        self._body = payload
        self._body_timer = self._loop.call_later(self._body_timeout, self._body_late, payload)
        payload.on_eof(lambda: self._body_complete(payload))

    def _body_complete(self, payload: StreamReader) -> None:
        if self._body is payload:
            self._stop_body_clock()

    def _stop_body_clock(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._body = None

    def _body_late(self, payload: StreamReader) -> None:
        self._body_timer = None
        if self._body is not payload:
            return
        self._body = None
        self._timed_out = True
        log.info(
            "request body not received within HTTP_BODY_TIMEOUT_SECONDS=%g; closing",
            self._body_timeout,
            extra={"action": "http_timeout"},
        )
        # A handler reading the body gets RequestTimeout (→ JSON 408 that closes); a
        # request loop still discarding an unread body after the answer gets it too, and
        # closes the connection.
        payload.set_exception(RequestTimeout(self._body_timeout))

    # --- errors aiohttp answers itself ---------------------------------------------

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse or a handler that raised past
        every middleware, as JSON. Always closes the connection (as aiohttp's does)."""
        if request.writer.output_size > 0:
            # Part of a response went out already: nothing can follow it (aiohttp's rule).
            raise ConnectionError("response already started; cannot send the error")
        status, code, text = self._describe(status, exc)
        if status >= 500:
            log.error(
                "unhandled error answering %s",
                request.remote,
                exc_info=exc,
                extra={"action": "http"},
            )
        elif not isinstance(exc, HeaderTimeout):
            # The class names the problem; the exception's text quotes the client's bytes.
            level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
            log.log(
                level,
                "%d %s from %s (%s)",
                status,
                code,
                request.remote,
                type(exc).__name__,
                extra={"action": "http_bad_request"},
            )
        response = error_response(status, code, text)
        response.force_close()
        return response

    def _describe(self, status: int, exc: BaseException | None) -> tuple[int, str, str]:
        if isinstance(exc, HeaderTimeout):
            return (
                408,
                "REQUEST_TIMEOUT",
                "the request line and headers did not arrive within "
                f"HTTP_HEADER_TIMEOUT_SECONDS={self._header_timeout:g}",
            )
        if isinstance(exc, LineTooLong):
            # The parser raises it for the request target and for a header alike.
            if self._line_complete and self._line_bytes <= self.max_line_size:
                return 431, "HEADER_TOO_LARGE", f"a header is over {self.max_field_size} bytes"
            return 414, "URI_TOO_LONG", f"the request target is over {self.max_line_size} bytes"
        if isinstance(exc, BadHttpMessage) and "too many headers" in exc.message.lower():
            return 431, "HEADER_TOO_LARGE", f"more than {self.max_headers} headers"
        if status == 400:
            what = type(exc).__name__ if exc is not None else "malformed request"
            return 400, "BAD_REQUEST", f"not a valid HTTP request ({what})"
        if status >= 500:
            return 500, "INTERNAL", "internal error; see the server log"
        return status, "HTTP_ERROR", HTTPStatus(status).phrase

    def log_exception(self, *args: Any, **kw: Any) -> None:
        if isinstance(kw.get("exc_info"), RequestTimeout):
            return  # the body deadline ended a discarded body; logged when it passed
        super().log_exception(*args, **kw)


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str, port: int) -> AsyncIterator[tuple[str, int]]:
    """Starts `app` (its cleanup contexts: pool, bridge) and serves it on host:port with
    :class:`ArmRequestHandler`; yields the address bound (port 0 → a free one). On exit,
    stops listening, lets requests in flight finish and cleans the app up."""
    settings = app[SETTINGS]
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    try:
        manager = runner.server  # aiohttp's Server: tracks connections, drives shutdown
        assert manager is not None
        loop = asyncio.get_running_loop()

        def connection() -> ArmRequestHandler:
            return ArmRequestHandler(
                manager,
                loop=loop,
                access_log=None,
                keepalive_timeout=KEEPALIVE_SECONDS,
                header_timeout=settings.http_header_timeout_seconds,
                body_timeout=settings.http_body_timeout_seconds,
            )

        listener = await loop.create_server(connection, host, port)
        try:
            bound = listener.sockets[0].getsockname()
            yield str(bound[0]), int(bound[1])
        finally:
            listener.close()
    finally:
        await runner.cleanup()


def run(app: web.Application, host: str, port: int) -> None:
    """`arm-core serve` and `arm-core bridge`: serve until SIGINT or SIGTERM, then stop
    cleanly (the cleanup contexts stop the bridge — the batch in flight commits or rolls
    back — and close the pool)."""

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        async with serving(app, host, port):
            await stopping.wait()

    asyncio.run(main())
