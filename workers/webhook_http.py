"""One webhook HTTP attempt: checked by the SSRF guard, pinned to the checked address, bounded.

The target is resolved afresh for every attempt and every address is checked (shared/ssrf.py);
the request then connects to a checked address, never to a second resolution of the name, so a
DNS answer that changes between the check and the connection (rebinding) cannot redirect it. The
URL's host is replaced by that address while the Host header and, for https, the TLS SNI name
(httpx's `sni_hostname` extension) stay the original name, and the certificate is verified
against that name. Redirects are never followed, proxies from the environment are ignored (they
would connect elsewhere), at most RESPONSE_CAP_BYTES of the answer are read, and every network
wait (connect, send, answer) is cut at the attempt timeout. Each attempt has its own client, so no
connection, verified for one host name, ever serves another; the TLS settings and trust roots they
share are built once (_tls_context).
"""

from __future__ import annotations

import functools
import socket
import ssl
import time
from dataclasses import dataclass

import httpx

from shared import ssrf
from shared.errors import InvalidRequest

#: Most bytes of a receiver's answer read (then the connection is closed): the status is all
#: that matters, and a receiver streaming a large answer must not hold the worker.
RESPONSE_CAP_BYTES = 4096
USER_AGENT = "genq-webhooks/1"


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
    except httpx.TimeoutException:
        return result(error=f"timeout: no answer within {timeout_s:g} s")
    except (httpx.HTTPError, OSError) as exc:
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


def _post_pinned(
    url: str, addresses: list[str], body: bytes, headers: dict[str, str], timeout_s: float
) -> int:
    """POST to each checked address in turn until one accepts the connection; its status."""
    original = httpx.URL(url)
    request_headers = {
        **headers,
        "host": original.netloc.decode("ascii"),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }
    sni = {"sni_hostname": original.raw_host.decode("ascii")}
    tls = _tls_context()
    with httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False, verify=tls) as client:
        failure: httpx.ConnectError | None = None
        for address in addresses:
            pinned = original.copy_with(host=address.split("%", 1)[0])
            request = client.build_request(
                "POST", pinned, content=body, headers=request_headers, extensions=sni
            )
            try:
                response = client.send(request, stream=True)
            except httpx.ConnectError as exc:
                failure = exc
                continue
            try:
                _read_capped(response, time.monotonic() + timeout_s)
            finally:
                response.close()
            return response.status_code
        raise failure or httpx.ConnectError("no address to connect to")


def _read_capped(response: httpx.Response, deadline: float) -> None:
    """Read at most RESPONSE_CAP_BYTES, and stop at the deadline (a receiver that answers its
    status and then drips its body keeps nobody waiting)."""
    received = 0
    for chunk in response.iter_raw():  # as each read arrives: a chunk size would wait to fill it
        received += len(chunk)
        if received >= RESPONSE_CAP_BYTES or time.monotonic() > deadline:
            return
