"""What an API without keys checks before anything else (the hot paths and FastAPI alike).

Without keys, anyone who can reach the port is trusted, and on loopback a browser can reach it:
- a page that rebinds its own DNS name to 127.0.0.1 reads the API as same-origin, but its
  requests still carry its name in `Host`, so only the names in GENQ_ALLOWED_HOSTS are served
  (403 otherwise);
- a cross-site form or `fetch` without a preflight may POST only "simple" content types
  (text/plain, form encodings), so a POST with a body must say `application/json` (415 otherwise).
  The one exception, a file upload (`multipart/form-data` to /v1/files), must carry an
  `Authorization` header (any value, as OpenAI's clients always send): a cross-site page cannot
  add one without a CORS preflight, which this API never grants.
The probes (/healthz, /readyz) answer under any name: kubelets send the pod's address as Host,
and they reveal nothing. `*` in GENQ_ALLOWED_HOSTS serves every name.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from api.edge.errors import genq_error_response
from shared.errors import Forbidden, GenqError, UnsupportedMediaType


class AnonymousGuard:
    def __init__(self, app: ASGIApp, allowed_hosts: list[str]) -> None:
        self.app = app
        self.allowed_hosts = frozenset(host.lower() for host in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = refusal_of(scope, self.allowed_hosts) if scope["type"] == "http" else None
        if refusal is not None:
            await genq_error_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)


#: Paths served under any Host.
PROBES = frozenset({"/healthz", "/readyz"})


def refusal_of(scope: Scope, allowed_hosts: frozenset[str]) -> GenqError | None:
    headers = dict(scope["headers"])
    host = headers.get(b"host", b"").decode("latin-1").lower()
    any_host = "*" in allowed_hosts or scope["path"] in PROBES
    if not any_host and _host_name(host) not in allowed_hosts:
        return Forbidden(
            "this API serves without keys only under the names in GENQ_ALLOWED_HOSTS", param="Host"
        )
    if scope["method"] == "POST" and _has_body(headers):
        media_type = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
        if media_type != b"application/json" and not _upload(scope, media_type, headers):
            return UnsupportedMediaType(
                "a request body must be sent as application/json", param="Content-Type"
            )
    return None


#: The path that takes multipart uploads.
UPLOAD_PATH = "/v1/files"


def _upload(scope: Scope, media_type: bytes, headers: dict[bytes, bytes]) -> bool:
    """A file upload a cross-site page could not have sent (it carries Authorization)."""
    multipart = media_type == b"multipart/form-data"
    return scope["path"] == UPLOAD_PATH and multipart and b"authorization" in headers


def _host_name(host: str) -> str:
    """The Host header without its port ("[::1]:8000" -> "[::1]")."""
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    return b"transfer-encoding" in headers or (length is not None and length.strip() not in (b"", b"0"))
