"""Bearer-token authentication with two scopes.

With `PTCTL_API_TOKENS` unset nothing is checked (the embedded default, bound to 127.0.0.1). With
tokens configured, every `/studies` endpoint needs `Authorization: Bearer <token>`: a `read` token
may read, an `admin` token may also submit, cancel and resume. Missing or unknown token → 401,
read token on a mutating endpoint → 403. Tokens are compared in constant time and never echoed.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.settings import Scope

bearer = HTTPBearer(auto_error=False, description="a token of PTCTL_API_TOKENS (scopes: read, admin)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _scope_of(token: str, tokens: dict[str, Scope]) -> Scope | None:
    found = None
    for known, scope in tokens.items():  # no early exit: timing does not tell which token matched
        if hmac.compare_digest(known.encode(), token.encode()):
            found = scope
    return found


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"})


def require(scope: Scope) -> Any:  # FastAPI types `Depends(...)` as Any (it serves as a parameter default)
    """A dependency admitting requests whose token grants `scope` (admin grants read too)."""

    def check(request: Request, credentials: Credentials) -> None:
        tokens: dict[str, Scope] = request.app.state.tokens
        if not tokens:
            return
        if credentials is None:
            raise _unauthorized("missing bearer token: send `Authorization: Bearer <token>` "
                                "(the CLI reads it from PTCTL_TOKEN)")
        granted = _scope_of(credentials.credentials, tokens)
        if granted is None:
            raise _unauthorized("unknown bearer token: use one of the tokens in the server's PTCTL_API_TOKENS")
        if scope == "admin" and granted != "admin":
            raise HTTPException(status.HTTP_403_FORBIDDEN, "this token is read-only: use an admin token")

    return Depends(check)


Read = require("read")
Admin = require("admin")
