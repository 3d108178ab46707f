"""Secrets in messages: a URL shown with its password (or NATS token) as ``***``; a
message about a token, a seed or a JWT shows none of it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_KEYWORD_START = re.compile(r"\s*[A-Za-z_]+\s*=")
_PASSWORD_PARAM = re.compile(r"(?i)\b((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&#]*)")
# scheme://user:password@ inside a longer text (a driver's message).
_URL_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^\s/?#@\"':]*)(:[^\s/?#@\"']*)?@")


def _split_userinfo(url: str) -> tuple[str, str | None, str | None, str]:
    """(scheme://, user, password, the rest after @) of `url`, cut at the *last* @ so a
    password with an unencoded @ stays whole; None for a part not there."""
    at = url.find("://")
    head, rest = (url[: at + 3], url[at + 3 :]) if at >= 0 else ("", url)
    userinfo, at_sign, location = rest.rpartition("@")
    if not at_sign:
        return head, None, None, rest
    user, colon, password = userinfo.partition(":")
    return head, user, (password if colon else None), location


def _keywords(url: str) -> bool:
    """Whether `url` is libpq's key=value form (host=db password=…), not a URL (with or
    without its scheme: user:password@host/db is masked as one)."""
    return "://" not in url and _KEYWORD_START.match(url) is not None


def mask_url(url: str, bare_user_is_secret: bool = False) -> str:
    """`url` for a message: postgresql://admin:***@host/db. A password in the query
    (`?password=…`, libpq's `password=…` form) becomes *** too. A userinfo without a
    colon is a user name for PostgreSQL but a token for NATS (nats://token@host): with
    `bare_user_is_secret` it is masked as well."""
    if _keywords(url):  # only a password= to hide
        return _PASSWORD_PARAM.sub(r"\1***", url)
    head, user, password, location = _split_userinfo(url)
    if password is not None:
        location = f"{user}:***@{location}"
    elif user is not None:
        location = f"{'***' if bare_user_is_secret or not head else user}@{location}"
    return head + _PASSWORD_PARAM.sub(r"\1***", location)


def mask_urls_in(text: str) -> str:
    """`text` (a driver's error message, say) with every scheme://user:password@ in it
    masked and every password=… parameter replaced by ***."""
    masked = _URL_USERINFO.sub(lambda m: f"{m[1]}{':***' if m[2] else ''}@", text)
    return _PASSWORD_PARAM.sub(r"\1***", masked)


def url_secrets(url: str, bare_user_is_secret: bool) -> list[str]:
    """The password of `url` (or its token) as written and percent-decoded; of a
    key=value conninfo, its password= values."""
    found = [m.group(2).strip("'") for m in _PASSWORD_PARAM.finditer(url) if m.group(2)]
    if _keywords(url):
        return found
    _, user, password, _ = _split_userinfo(url)
    secret = password if password is not None else (user if bare_user_is_secret else None)
    return [*found, secret, unquote(secret)] if secret else found
