"""Every error the API sends is JSON: {"error": {"code", "message"[, "details"]}}: the
middleware gives that shape to ApiError, aiohttp's own HTTP errors and the database's,
and makes an unexpected exception a 500 with a logged traceback. (A request aiohttp
cannot parse gets its own plain-text 400: arm_core.http.server.)"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from arm_core.db import DatabaseConflict, DatabasePoolExhausted, DatabaseUnavailable

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# aiohttp's status → our code, for errors raised by aiohttp itself.
_HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    408: "REQUEST_TIMEOUT",
    413: "PAYLOAD_TOO_LARGE",
    414: "URI_TOO_LONG",
    415: "UNSUPPORTED_MEDIA_TYPE",
    431: "HEADER_TOO_LARGE",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.details, self.headers = details, headers


def invalid(message: str, details: dict[str, Any] | None = None) -> ApiError:
    return ApiError(400, "VALIDATION_ERROR", message, details)


def invalid_parameter(parameter: str, message: str) -> ApiError:
    return invalid(f"{parameter}: {message}", {"parameter": parameter})


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        error = exc
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        message = exc.reason if exc.status != 404 else f"no route {request.method} {request.path}"
        code = _HTTP_CODES.get(exc.status, "HTTP_ERROR")
        error = ApiError(exc.status, code, message, headers=headers)
    except DatabaseUnavailable as exc:
        # Logged once per outage by the process's Outage (arm_core.db), not per request.
        log.debug("database unavailable: %s", exc, extra={"action": "http"})
        error = ApiError(503, "DATABASE_UNAVAILABLE", "the database cannot be reached")
    except DatabaseConflict as exc:
        # Rolled back by a concurrent transaction after every try the store makes
        # (arm_core.store); nothing of the request was done.
        log.warning("database conflict: %s", exc, extra={"action": "http"})
        error = ApiError(
            503,
            "DATABASE_CONFLICT",
            "a concurrent change got in the way and nothing was done; try again",
            headers={"Retry-After": "1"},
        )
    except DatabasePoolExhausted as exc:
        # Not an outage: every connection is busy. Logged once by its PoolExhaustion.
        log.debug("database pool exhausted: %s", exc, extra={"action": "http"})
        error = ApiError(
            503,
            "DATABASE_POOL_EXHAUSTED",
            "every database connection of this process is in use "
            f"(DATABASE_POOL_MAX_SIZE={exc.figures.max_size}); try again shortly",
        )
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        error = ApiError(500, "INTERNAL", "internal error; see the server log")
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.details:
        body["details"] = error.details
    response = web.json_response({"error": body}, status=error.status, headers=error.headers)
    if error.status == 408:  # the body did not arrive in time: the rest never comes
        response.force_close()
    return response
