"""One webhook HTTP attempt: checked by the SSRF guard, pinned to the checked address, bounded.

The target is resolved afresh for every attempt and every address is checked (shared/ssrf.py);
the request connects to a checked address, never to a second resolution of the name, so DNS
rebinding cannot redirect it, while the Host header, the TLS SNI name and certificate check keep
the original name. Redirects are never followed, no proxy is used, at most RESPONSE_CAP_BYTES of
the body are read, and every wait (connect, send, the whole answer however slowly it drips) is
cut at the attempt timeout. Connections are reused only for the same scheme, host name, port and
checked address (workers/webhooks/connections.py)."""

from __future__ import annotations

import functools
import http.client
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from shared import ssrf
from shared.errors import InvalidRequest
from workers.webhooks.connections import AnswerTooLarge, ConnectError, Connection, Pool, Route, tls_context

#: Most bytes of a receiver's answer read (then the connection is closed): the status is all
#: that matters, and a receiver streaming a large answer must not hold the worker.
RESPONSE_CAP_BYTES = 4096
USER_AGENT = "genq-webhooks/1"
#: Network trouble that ends an attempt as an error (timeouts, an OSError too, are told apart
#: first). ssl.SSLError and ConnectError are OSErrors; an answer that is not HTTP is an HTTPException.
NETWORK_ERRORS = (http.client.HTTPException, OSError)
#: How a kept connection the receiver closed as the request went out fails, before any answer.
CLOSED_UNDER_US = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)

#: The kept-alive connections of every attempt this process makes.
_POOL = Pool()


@dataclass(frozen=True, slots=True)
class AttemptResult:
    status_code: int | None
    error: str | None
    #: The SSRF guard refused the target (final: not retried).
    refused: bool
    duration_ms: float


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
    except TimeoutError:
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
    """What an attempt needs of its URL, parsed and checked once per URL (they repeat: one per
    receiver)."""

    scheme: str
    #: The host name (IDNA-encoded), without brackets for an IPv6 literal.
    host: str
    port: int
    #: The request's target: the path and query, percent-encoded.
    target: str
    #: The headers every attempt to this URL sends alike (Host: the name, and the port when it is
    #: not the scheme's default).
    headers: dict[str, str]


#: What http.client refuses in a request's target: controls and spaces (no header can be slipped in).
_TARGET_REFUSED = re.compile(r"[\x00-\x20\x7f]")
#: A header as an attempt may send it: a token, then a value of visible ASCII and spaces. Stricter
#: than http.client's check (a value is never folded, never holds a control or a byte past ASCII):
#: no value can end its line and start another.
_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\x20-\x7e]*")


@functools.lru_cache(maxsize=1024)
def _parse(url: str) -> _Url:
    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    target = parsed.raw_path.decode("ascii")
    if not target.startswith("/") or _TARGET_REFUSED.search(target):
        raise http.client.InvalidURL(f"the URL's path can not be sent as it is: {target!r}")
    # accept-encoding: identity, as http.client sends it: an answer's body is never decoded.
    common = {"host": parsed.netloc.decode("ascii"), "accept": "*/*", "accept-encoding": "identity",
              "content-type": "application/json", "user-agent": USER_AGENT}  # fmt: skip
    return _Url(parsed.scheme, parsed.raw_host.decode("ascii"), port, target, _checked(common))


def _checked(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers`, each checked; ValueError for a name or value that could not be sent as it is
    (a value holding a line break would add a header of its own)."""
    for name, value in headers.items():
        if not (_NAME.fullmatch(name) and _VALUE.fullmatch(value)):
            raise ValueError(f"the webhook header {name!r} can not be sent as it is")
    return dict(headers)


@dataclass(frozen=True, slots=True)
class _Request:
    """One attempt's request: its target, every header it sends, its body."""

    target: str
    headers: dict[str, str]
    body: bytes


def _post_pinned(
    url: str, addresses: list[str], body: bytes, headers: dict[str, str], timeout_s: float
) -> int:
    """POST to each checked address in turn until one accepts the connection; its status."""
    parsed = _parse(url)
    request = _Request(parsed.target, {**parsed.headers, **_checked(headers)}, body)
    failure: ConnectError | None = None
    for address in addresses:
        route = Route(parsed.scheme, parsed.host, parsed.port, address.split("%", 1)[0])
        try:
            return _send(route, request, timeout_s)
        except ConnectError as exc:
            failure = exc
    raise failure or ConnectError("no address to connect to")


def _send(route: Route, request: _Request, timeout_s: float) -> int:
    """The status of one POST on a kept connection to `route`, or on a new one. A kept one the
    receiver closed as the request went out (it failed before any answer's status line) gets the
    request once more on a new connection, as a receiver that had closed it earlier would have."""
    tls = tls_context()
    connection = _POOL.take(route, tls)
    answered = connection.answered
    try:
        return _exchange(connection, request, timeout_s)
    except CLOSED_UNDER_US:
        if not connection.reused or connection.answered != answered:
            raise
    return _exchange(Connection(route, tls), request, timeout_s)


def _exchange(connection: Connection, request: _Request, timeout_s: float) -> int:
    """Send the request on `connection`, read at most the cap of its answer, and give the
    connection back (kept only when the answer was read to its end and the receiver did not ask
    to close: http.client then lets go of its socket)."""
    connection.set_timeout(timeout_s)
    try:
        response = connection.exchange(request.target, request.headers, request.body, timeout_s)
        try:
            connection.reusable = _read_capped(response)
        finally:
            response.close()  # its reader, not the socket: the connection may carry the next request
        return response.status
    finally:
        _POOL.give_back(connection)


def _read_capped(response: http.client.HTTPResponse) -> bool:
    """Read at most RESPONSE_CAP_BYTES of the answer's body, until its deadline (a receiver that
    answers its status and then drips its body keeps nobody waiting: the status is all that
    matters); whether the answer was read to its end."""
    received = 0
    try:
        while chunk := response.read1(RESPONSE_CAP_BYTES):  # what one read brings: never waits to fill
            received += len(chunk)
            if received >= RESPONSE_CAP_BYTES:
                return False
    except (TimeoutError, AnswerTooLarge):
        return False
    return True
