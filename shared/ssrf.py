"""Server-side request forgery guard for webhook targets.

A target must be http(s), on an allowed port, and every address its host resolves to must be a
public unicast address: no loopback, private (RFC 1918, fc00::/7), link-local (169.254.0.0/16 with
the cloud metadata address, fe80::/10), multicast, unspecified or reserved, including such
addresses written as IPv4-mapped IPv6 or as a bare decimal number. It is checked at submit (422)
and again right before each delivery, after a fresh DNS resolution (defeats DNS rebinding); the
delivery then connects to the address that was checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from shared.errors import InvalidRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    allow_private: bool
    allowed_ports: frozenset[int]


def parse_ports(spec: str) -> frozenset[int]:
    """ "80,443,8000-9999" -> the set of those ports."""
    ports: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        if low:
            ports.update(range(int(low), int(high or low) + 1))
    return frozenset(ports)


def blocked_reason(address: IPAddress) -> str | None:
    """Why a webhook may not target this address, or None when it may."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    checks = [
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("unspecified", address.is_unspecified),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
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
        reason = blocked_reason(ipaddress.ip_address(text.split("%", 1)[0]))
        if reason is not None:
            raise InvalidRequest(
                f"webhook host {host!r} resolves to a {reason} address ({text})", param="webhook"
            )
    return addresses


def resolve(target: Target, policy: TargetPolicy) -> list[str]:
    """Blocking: the checked addresses of a target (for the delivery worker)."""
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        infos = []
    return check_addresses(target.host, list(dict.fromkeys(str(info[4][0]) for info in infos)), policy)


async def check_url(url: str, policy: TargetPolicy) -> None:
    """At submit: refuse a target that is not allowed (DNS resolution off the event loop)."""
    target = parse_target(url, policy)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM
        )
    except socket.gaierror:
        infos = []
    check_addresses(target.host, list(dict.fromkeys(str(info[4][0]) for info in infos)), policy)
