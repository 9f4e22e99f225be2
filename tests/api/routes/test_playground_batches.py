"""The playground lists the key's batches with their progress, in a real headless Chromium
against a live server and a real worker (as tests/api/routes/test_playground.py)."""

from __future__ import annotations

from collections.abc import Callable

import redis

from shared.config import Settings
from tests.api.live_server import live_server
from tests.api.routes.test_batches import CHAT, chat_line, upload, wait_for
from tests.api.routes.test_openai import client_for
from tests.api.routes.test_playground import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _playwright
from tests.conftest import WorkerProcess


def test_the_keys_batches_are_listed_with_their_progress(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    sync_api = _playwright()
    settings = make_settings(api_keys=["playground-key", "other-key"])
    start_worker(settings)
    with live_server(settings) as url, sync_api.sync_playwright() as playwright:  # type: ignore[attr-defined]
        client, other = client_for(url, "playground-key"), client_for(url, "other-key")
        content = chat_line("a", "x") + chat_line("b", "y") + b"{broken\n"
        batch = client.batches.create(
            input_file_id=upload(client, content), endpoint=CHAT, completion_window="24h"
        )
        wait_for(client, batch.id, {"completed"})
        other.batches.create(
            input_file_id=upload(other, chat_line("c", "z")), endpoint=CHAT, completion_window="24h"
        )
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url + "/")
            page.get_by_label("Key", exact=True).fill("playground-key")
            page.get_by_role("button", name="Use key").click()
            item = page.locator("#batches li").first
            item.wait_for(timeout=10_000)
            assert page.locator("#batches li").count() == 1  # the other key's batch is not shown
            text = item.inner_text()
            assert "completed" in text and "3 / 3 (1 failed)" in text, text
            assert item.get_attribute("title") == batch.id
            assert item.locator("progress").get_attribute("value") == "3"
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "playground-batches.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()
