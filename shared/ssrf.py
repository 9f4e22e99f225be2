"""Server-side request forgery guard for webhook targets.

A target must be http(s), on an allowed port, and every address its host resolves to must be a
public unicast address: no loopback, private (RFC 1918, fc00::/7), link-local (169.254.0.0/16 with
the cloud metadata address, fe80::/10), multicast, unspecified or reserved, and nothing else that
is not globally reachable (`is_global`: 100.64.0.0/10 shared address space, where Alibaba Cloud's
metadata service and EKS custom-networking pods live; fec0::/10 site-local; documentation ranges).
An IPv6 address that carries an IPv4 address (IPv4-mapped, 6to4 2002::/16, Teredo 2001::/32,
NAT64 64:ff9b::/96) is judged by the IPv4 address too: a relay would deliver to it. Addresses
written as a bare decimal number are resolved like any other. It is checked at submit (422)
and again right before each delivery, after a fresh DNS resolution (defeats DNS rebinding); the
delivery then connects to the address that was checked.

At submit the host is resolved on a small pool of its own (HostResolver), within a time bound,
never on the event loop's default executor: redis-py's connection set-up resolves there, so names
served by a black-holed name server would otherwise stall every tenant's submits.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from shared.errors import InvalidRequest, Overloaded

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def lookup_addresses(host: str, port: int) -> list[str]:
    """Blocking: the addresses a host resolves to through the system resolver ([]: none)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        infos = []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class HostResolver:
    """Resolves webhook hosts at submit on `threads` threads of its own, each lookup within
    `timeout_s`. At most `threads + queue` lookups are pending at once (a timed-out lookup keeps
    its thread until the system resolver gives up, so it still counts); past that a submit is
    refused at once (503) rather than queued behind names that never answer."""

    def __init__(
        self,
        threads: int,
        queue: int,
        timeout_s: float,
        lookup: Callable[[str, int], list[str]] = lookup_addresses,
    ) -> None:
        self.timeout_s = timeout_s
        #: The blocking lookup run on the pool (tests point it at a name server they control).
        self.lookup = lookup
        self._room = threads + queue
        self._pending = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="genq-webhook-resolve")

    async def addresses(self, host: str, port: int) -> list[str]:
        """The host's addresses; InvalidRequest when they take longer than timeout_s, Overloaded
        when the pool and its queue are full."""
        with self._lock:
            if self._pending >= self._room:
                raise Overloaded(
                    f"{self._pending} webhook host lookups are pending; retry shortly", retry_after_s=1.0
                )
            self._pending += 1
        future = self._pool.submit(self.lookup, host, port)
        future.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except TimeoutError:
            raise InvalidRequest(
                f"webhook host {host!r} could not be resolved within {self.timeout_s:g} s", param="webhook"
            ) from None

    def pending(self) -> int:
        """Lookups submitted and not yet returned (timed-out ones included)."""
        with self._lock:
            return self._pending

    def _done(self, _: object) -> None:
        with self._lock:
            self._pending -= 1


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    allow_private: bool
    allowed_ports: frozenset[int]
    #: Resolves hosts at submit (check_url); compared by identity, like the settings it is from.
    resolver: HostResolver = field(
        default_factory=lambda: HostResolver(threads=4, queue=64, timeout_s=2.0), compare=False
    )


def parse_ports(spec: str) -> frozenset[int]:
    """ "80,443,8000-9999" -> the set of those ports."""
    ports: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        if low:
            ports.update(range(int(low), int(high or low) + 1))
    return frozenset(ports)


#: RFC 6052's well-known NAT64 prefix: the last 32 bits are the IPv4 address the gateway reaches.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address delivers to: IPv4-mapped, 6to4, Teredo (its client, the
    obfuscated last 32 bits) or NAT64; None when it carries none."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def blocked_reason(address: IPAddress) -> str | None:
    """Why a webhook may not target this address, or None when it may."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            reason = _class_of(inner)
            # The relay prefixes themselves (2002::/16, 2001::/32) are not "global" in Python's
            # table; a public IPv4 address inside is what is reached, so it decides.
            return None if reason is None else f"{reason} (IPv4 {inner} inside)"
    return _class_of(address)


@functools.lru_cache(maxsize=4096)
def _blocked_reason_of(text: str) -> str | None:
    """blocked_reason of an address as resolved (its text), remembered: an address's classes never
    change, and judging one scans every class's table of networks, a cost paid for each address of
    each webhook submit and delivery attempt, which resolve the same few addresses."""
    return blocked_reason(ipaddress.ip_address(text))


def _class_of(address: IPAddress) -> str | None:
    checks = [
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("unspecified", address.is_unspecified),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("site-local", isinstance(address, ipaddress.IPv6Address) and address.is_site_local),
        ("non-global", not address.is_global),
    ]
    return next((name for name, hit in checks if hit), None)


@dataclass(frozen=True, slots=True)
class Target:
    scheme: str
    host: str
    port: int


def parse_target(url: str, policy: TargetPolicy) -> Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest("webhook must be an http(s) URL with a host", param="webhook")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InvalidRequest("webhook URL has an invalid port", param="webhook") from None
    if not policy.allow_private and port not in policy.allowed_ports:
        raise InvalidRequest(f"webhook port {port} is not allowed", param="webhook")
    return Target(parts.scheme, parts.hostname, port)


def check_addresses(host: str, addresses: list[str], policy: TargetPolicy) -> list[str]:
    if not addresses:
        raise InvalidRequest(f"webhook host {host!r} does not resolve", param="webhook")
    if policy.allow_private:
        return addresses
    for text in addresses:
        reason = _blocked_reason_of(text.split("%", 1)[0])
        if reason is not None:
            raise InvalidRequest(
                f"webhook host {host!r} resolves to a {reason} address ({text})", param="webhook"
            )
    return addresses


def resolve(target: Target, policy: TargetPolicy) -> list[str]:
    """Blocking: the checked addresses of a target (for the delivery worker)."""
    return check_addresses(target.host, lookup_addresses(target.host, target.port), policy)


async def check_url(url: str, policy: TargetPolicy) -> None:
    """At submit: refuse a target that is not allowed (resolved on the policy's own resolver)."""
    target = parse_target(url, policy)
    check_addresses(target.host, await policy.resolver.addresses(target.host, target.port), policy)
