"""The SSRF guard with the default policy: every forbidden address class is refused at submit
(422, param webhook, nothing created) and by the delivery worker's check right before it connects."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest

from shared.config import Settings
from workers.webhooks import client

BLOCKED = [
    ("http://127.0.0.1:8080/hook", "loopback"),
    ("http://localhost:8080/hook", "loopback"),  # a name that resolves to loopback
    ("http://[::ffff:127.0.0.1]:8080/", "loopback (IPv4 127.0.0.1 inside)"),  # IPv4-mapped IPv6
    ("http://2130706433:8080/", "loopback"),  # 127.0.0.1 as one decimal number
    ("http://10.1.2.3/", "private"),
    ("http://172.16.0.1/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://[fc00::1]/", "private"),
    ("http://[fd12:3456::1]/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),  # cloud metadata
    ("http://[fe80::1]/", "link-local"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[ff02::1]/", "multicast"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://100.64.0.1/", "non-global"),  # shared address space (CGNAT, EKS custom networking)
    ("http://100.100.100.200/latest/meta-data/", "non-global"),  # Alibaba Cloud's metadata service
    ("http://192.0.2.1/", "private"),  # documentation range
    ("http://[fec0::1]/", "site-local"),
    ("http://[2002:a00:1::]/", "private (IPv4 10.0.0.1 inside)"),  # 6to4
    ("http://[2002:a9fe:a9fe::1]/", "link-local (IPv4 169.254.169.254 inside)"),  # 6to4 metadata
    ("http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/", "private (IPv4 10.0.0.1 inside)"),  # Teredo
    ("http://[64:ff9b::7f00:1]/", "loopback (IPv4 127.0.0.1 inside)"),  # NAT64
    ("http://[64:ff9b::6464:6404]/", "non-global (IPv4 100.100.100.4 inside)"),  # NAT64 to CGNAT
    ("http://93.184.216.34:22/", "port 22 is not allowed"),
    ("https://93.184.216.34:6379/", "port 6379 is not allowed"),
]
ALLOWED = [
    "http://93.184.216.34/hook",
    "https://93.184.216.34:8443/hook",
    "http://[2606:2800:220:1::1]/",
    "http://[2002:5db8:d822::1]/",  # 6to4 of a public address
    "http://[64:ff9b::5db8:d822]/",  # NAT64 of a public address
]


@pytest.mark.anyio
@pytest.mark.parametrize(("url", "reason"), BLOCKED)
async def test_submit_refuses_forbidden_targets(api: httpx.AsyncClient, url: str, reason: str) -> None:
    response = await api.post("/v1/jobs", json={"prompt": "x", "webhook": url})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["param"] == "webhook" and error["type"] == "invalid_request"
    assert reason in error["message"]
    assert (await api.get("/v1/jobs")).json()["data"] == []


@pytest.mark.anyio
@pytest.mark.parametrize("url", ALLOWED)
async def test_submit_accepts_public_targets(api: httpx.AsyncClient, url: str) -> None:
    response = await api.post("/v1/jobs", json={"prompt": "x", "webhook": url})
    assert response.status_code == 202, response.text


@pytest.mark.parametrize(("url", "reason"), BLOCKED)
def test_delivery_check_refuses_forbidden_targets(settings: Settings, url: str, reason: str) -> None:
    for _ in range(2):  # and again, when the address's verdict is remembered
        with pytest.raises(client.Refused, match=re.escape(reason)):
            client.checked_addresses(url, settings.webhook_policy)


@pytest.mark.parametrize("url", ALLOWED)
def test_delivery_check_allows_public_targets_every_time(settings: Settings, url: str) -> None:
    for _ in range(2):
        assert client.checked_addresses(url, settings.webhook_policy)


def test_delivery_refusal_is_final_and_sends_nothing(settings: Settings) -> None:
    result = client.post("http://localhost:8080/", b"{}", {}, settings.webhook_policy, 1.0)
    assert result.refused and result.status_code is None
    assert result.error is not None and "loopback" in result.error


def test_lifting_the_guard_allows_private_targets_on_any_port(make_settings: Callable[..., Settings]) -> None:
    lifted = make_settings(webhook_allow_private=True).webhook_policy
    assert client.checked_addresses("http://127.0.0.1:6379/", lifted) == ["127.0.0.1"]
