"""The playground page at `/`: served by the API, kept out of the schema, and used for real in a
headless Chromium (Debian's `chromium` package, driven by Playwright) against a live server and a
real worker."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from shared.config import Settings
from tests.api.live_server import live_server
from tests.conftest import ROOT, WorkerProcess

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = ROOT / "test-artifacts"


@pytest.mark.anyio
async def test_the_page_and_its_assets_are_served_outside_the_schema(api: httpx.AsyncClient) -> None:
    page = await api.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for asset, kind in (("/static/app.js", "javascript"), ("/static/app.css", "text/css")):
        response = await api.get(asset)
        assert response.status_code == 200 and kind in response.headers["content-type"]
    paths = (await api.get("/openapi.json")).json()["paths"]
    assert "/" not in paths and not any(p.startswith("/static") for p in paths)
    assert "/v1/jobs/{job_id}/stream" in paths and "/v1/chat/completions" in paths


def _playwright() -> object:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's `chromium` package to run the browser test")
    return pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")


def test_a_prompt_streams_its_answer_in_a_real_browser(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    sync_api = _playwright()
    settings = make_settings(placeholder_step_s=0.03, api_keys=["playground-key"])
    start_worker(settings)
    ARTIFACTS.mkdir(exist_ok=True)
    with live_server(settings) as url, sync_api.sync_playwright() as playwright:  # type: ignore[attr-defined]
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url + "/")
            # The server wants a key: the page asks for one (and keeps it in sessionStorage only).
            page.get_by_label("Key", exact=True).fill("playground-key")
            page.get_by_role("button", name="Use key").click()
            page.get_by_role("textbox", name="Prompt").fill("the quick brown fox jumps over the lazy dog")
            page.get_by_label("Max tokens").fill("12")
            page.get_by_role("button", name="Generate").click()
            status = page.locator("#status")
            status.filter(has_text="succeeded").wait_for(timeout=30_000)
            answer = "the quick brown fox jumps over the lazy dog the quick brown"
            assert page.locator("#output").inner_text() == answer
            assert page.locator("#tokens").inner_text() == "12"
            assert page.locator("#job-id").inner_text() != "—"
            assert page.locator("#queue-time").inner_text().endswith(("ms", "s"))
            page.locator("#jobs li").first.wait_for(timeout=10_000)
            assert "succeeded" in page.locator("#jobs li").first.inner_text()
            assert page.evaluate("sessionStorage.getItem('genq.apiKey')") == "playground-key"
            assert page.evaluate("localStorage.length") == 0
            page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()
