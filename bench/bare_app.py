"""The ceiling for bench.gateway: FastAPI on uvicorn answering a constant JSON body, nothing else.

    python -m bench.bare_app --port P [--workers N]

Run with the uvicorn settings `genq api` uses (cli/main.py: factory, no access log, no log
config), so the difference to the API is the API's own work: middleware, validation, Redis.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import orjson
import uvicorn
from fastapi import FastAPI, Request, Response

#: About the size of a queued job's JSON, so both sides write similar bytes.
BODY = orjson.dumps({"id": "0" * 36, "status": "queued", "padding": "x" * 700})


def create_app() -> FastAPI:
    app = FastAPI()

    @app.get("/")
    async def constant() -> Response:
        return Response(BODY, media_type="application/json")

    @app.post("/")
    async def constant_post(request: Request) -> Response:
        await request.body()
        return Response(BODY, 202, media_type="application/json")

    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    uvicorn.run(
        "bench.bare_app:create_app", factory=True, host="127.0.0.1", port=args.port,
        workers=args.workers, access_log=False, log_config=None, timeout_graceful_shutdown=30,
    )  # fmt: skip


if __name__ == "__main__":
    main()
