"""One webhook HTTP attempt: checked by the SSRF guard, pinned to the checked address, bounded.

The target is resolved afresh for every attempt and every address is checked (shared/ssrf.py);
the request then connects to a checked address, never to a second resolution of the name, so a
DNS answer that changes between the check and the connection (rebinding) cannot redirect it. The
URL's host is replaced by that address while the Host header and, for https, the TLS SNI name
(httpcore's `sni_hostname` extension) stay the original name, and the certificate is verified
against that name. Redirects are never followed, proxies from the environment are ignored (they
would connect elsewhere), at most RESPONSE_CAP_BYTES of the answer are read, and every network
wait (connect, send, answer) is cut at the attempt timeout. A connection is kept alive for the
next attempt only to the same scheme, host name, port and checked address, and one the receiver
closed in between costs no failed attempt (workers/webhook_connections.py, which says why it is
not httpx's pool); no connection verified for one host name ever serves another. The TLS settings
and trust roots every connection shares are built once (_tls_context).
"""

from __future__ import annotations

import functools
import socket
import ssl
import time
from dataclasses import dataclass

import httpcore
import httpx

from shared import ssrf
from shared.errors import InvalidRequest
from workers.webhook_connections import Connection, Pool, Route

#: Most bytes of a receiver's answer read (then the connection is closed): the status is all
#: that matters, and a receiver streaming a large answer must not hold the worker.
RESPONSE_CAP_BYTES = 4096
USER_AGENT = "genq-webhooks/1"
#: Network trouble that ends an attempt as an error (timeouts are told apart).
NETWORK_ERRORS = (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, OSError)

#: The kept-alive connections of every attempt this process makes.
_POOL = Pool()


@dataclass(frozen=True, slots=True)
class AttemptResult:
    status_code: int | None
    error: str | None
    #: The SSRF guard refused the target (final: not retried).
    refused: bool
    duration_ms: float


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """What httpx builds for a client by default (certifi's roots, certificates and host names
    verified), built once: a new client built it each time, loading the CA bundle (~18 ms, which
    held one webhook worker near 50 deliveries/s). An SSLContext may serve threads at once."""
    return httpx.create_ssl_context(trust_env=False)


class Refused(Exception):
    """The SSRF guard refused the target."""


def post(
    url: str, body: bytes, headers: dict[str, str], policy: ssrf.TargetPolicy, timeout_s: float
) -> AttemptResult:
    """POST body to url once. Never raises for network trouble: the result says what happened."""
    started = time.monotonic()

    def result(
        status_code: int | None = None, error: str | None = None, refused: bool = False
    ) -> AttemptResult:
        duration_ms = round((time.monotonic() - started) * 1000, 1)
        return AttemptResult(status_code, error, refused, duration_ms)

    try:
        addresses = checked_addresses(url, policy)
        return result(status_code=_post_pinned(url, addresses, body, headers, timeout_s))
    except Refused as exc:
        return result(error=f"refused: {exc}", refused=True)
    except httpcore.TimeoutException:
        return result(error=f"timeout: no answer within {timeout_s:g} s")
    except NETWORK_ERRORS as exc:
        return result(error=f"{type(exc).__name__}: {exc}"[:300])


def checked_addresses(url: str, policy: ssrf.TargetPolicy) -> list[str]:
    """The target's addresses, resolved now, all allowed by the policy. Raises Refused for a
    target the guard forbids, OSError when the name does not resolve (that is retried: resolver
    failures are usually transient, unlike ssrf.resolve, which treats them as a refusal)."""
    try:
        target = ssrf.parse_target(url, policy)
    except InvalidRequest as exc:
        raise Refused(exc.message) from None
    infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    try:
        return ssrf.check_addresses(target.host, addresses, policy)
    except InvalidRequest as exc:
        raise Refused(exc.message) from None


@dataclass(frozen=True, slots=True)
class _Url:
    """What an attempt needs of its URL, parsed once per URL (they repeat: one per receiver)."""

    scheme: str
    #: The host name (IDNA-encoded), without brackets for an IPv6 literal.
    host: str
    port: int
    #: The Host header: the name, and the port when it is not the scheme's default.
    netloc: bytes
    #: Path and query, as sent.
    target: bytes


@functools.lru_cache(maxsize=1024)
def _parse(url: str) -> _Url:
    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return _Url(parsed.scheme, parsed.raw_host.decode("ascii"), port, parsed.netloc, parsed.raw_path)


def _post_pinned(
    url: str, addresses: list[str], body: bytes, headers: dict[str, str], timeout_s: float
) -> int:
    """POST to each checked address in turn until one accepts the connection; its status."""
    parsed = _parse(url)
    request_headers = {
        **headers,
        "host": parsed.netloc.decode("ascii"),
        "accept": "*/*",
        "content-type": "application/json",
        "content-length": str(len(body)),
        "user-agent": USER_AGENT,
    }
    failure: httpcore.ConnectError | None = None
    for address in addresses:
        route = Route(parsed.scheme, parsed.host, parsed.port, address.split("%", 1)[0])
        try:
            return _send(route, parsed.target, body, request_headers, timeout_s)
        except httpcore.ConnectError as exc:
            failure = exc
    raise failure or httpcore.ConnectError("no address to connect to")


def _send(route: Route, target: bytes, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """The status of one POST on a kept connection to `route`, or on a new one. A kept one the
    receiver closed as the request went out (it failed before any byte of an answer) gets the
    request once more on a new connection, as a receiver that had closed it earlier would have."""
    tls = _tls_context()
    connection = _POOL.take(route, tls)
    answered = connection.received
    try:
        return _exchange(connection, target, body, headers, timeout_s)
    except (httpcore.NetworkError, httpcore.RemoteProtocolError):
        if not connection.reused or connection.received != answered:
            raise
    return _exchange(Connection(route, tls), target, body, headers, timeout_s)


def _exchange(
    connection: Connection, target: bytes, body: bytes, headers: dict[str, str], timeout_s: float
) -> int:
    """Send the request on `connection`, read at most the cap of its answer, and give the
    connection back (kept only when the answer was read to its end)."""
    route = connection.route
    url = httpcore.URL(scheme=route.scheme, host=route.address, port=route.port, target=target)
    extensions = {
        "timeout": {"connect": timeout_s, "read": timeout_s, "write": timeout_s, "pool": timeout_s},
        "sni_hostname": route.host,
    }
    request = httpcore.Request(
        b"POST", url, headers=list(headers.items()), content=body, extensions=extensions
    )
    try:
        response = connection.http.handle_request(request)
        try:
            _read_capped(response, time.monotonic() + timeout_s)
        finally:
            response.close()
        return response.status
    finally:
        _POOL.give_back(connection)


def _read_capped(response: httpcore.Response, deadline: float) -> None:
    """Read at most RESPONSE_CAP_BYTES, and stop at the deadline (a receiver that answers its
    status and then drips its body keeps nobody waiting)."""
    received = 0
    for chunk in response.iter_stream():  # as each read arrives: a chunk size would wait to fill it
        received += len(chunk)
        if received >= RESPONSE_CAP_BYTES or time.monotonic() > deadline:
            return
