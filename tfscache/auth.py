"""The admin token check, one for every transport that asks for ``server.admin_token``: the admin
gRPC API (``authorization`` metadata) and the status page's JSON on the metrics port (the
``Authorization`` header), both ``Bearer <token>``.

    token = BearerToken(settings.server.admin_token)   # "" = no token: everything passes
    token.check(request.headers.get("Authorization"), "header")   # raises Unauthenticated
"""

from __future__ import annotations

import hmac

from tfscache import errors

MISSING = "admin token required: send {carrier} 'authorization: Bearer <token>'"
INVALID = "invalid admin token"


class BearerToken:
    """``authorization: Bearer <token>``, compared in constant time; no token set, no check."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode() if token else None

    @property
    def required(self) -> bool:
        return self._expected is not None

    def check(self, given: str | bytes | None, carrier: str = "metadata") -> None:
        """Pass, or raise Unauthenticated (gRPC UNAUTHENTICATED, HTTP 401): missing or wrong.
        ``carrier``: what the missing token's message says to send it in (metadata, header)."""
        if self._expected is None:
            return
        if given is None:
            raise errors.Unauthenticated(MISSING.format(carrier=carrier))
        value = given.encode() if isinstance(given, str) else given
        if not hmac.compare_digest(value, self._expected):
            raise errors.Unauthenticated(INVALID)
