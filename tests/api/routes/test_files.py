"""/v1/files through the official `openai` client over real HTTP: upload, list, read, content,
delete, each scoped to the caller's key; bad uploads refused with a 4xx naming the field."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import boto3
import httpx
import openai
import pytest
import redis

from shared.config import Settings
from tests.api.batches.test_filestore import BUCKET, s3_endpoint  # noqa: F401 (a fixture)
from tests.api.live_server import live_server
from tests.api.routes.test_openai import client_for

LINES = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


@pytest.fixture
def keyed_url(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Iterator[str]:
    with live_server(make_settings(api_keys=["alice-key", "bob-key"], file_max_bytes=4096)) as url:
        yield url


def test_upload_list_retrieve_content_delete(keyed_url: str, tmp_path: Path) -> None:
    alice, bob = client_for(keyed_url, "alice-key"), client_for(keyed_url, "bob-key")
    created = alice.files.create(file=("requests.jsonl", io.BytesIO(LINES)), purpose="batch")
    assert created.id.startswith("file-") and created.object == "file"
    assert (created.bytes, created.filename, created.purpose) == (len(LINES), "requests.jsonl", "batch")
    assert alice.files.retrieve(created.id).id == created.id
    assert [f.id for f in alice.files.list()] == [created.id]
    assert alice.files.content(created.id).content == LINES
    # Bob's key sees none of it.
    assert list(bob.files.list()) == []
    with pytest.raises(openai.NotFoundError):
        bob.files.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        bob.files.content(created.id)
    with pytest.raises(openai.NotFoundError):
        bob.files.delete(created.id)
    assert alice.files.delete(created.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(created.id)
    assert list(alice.files.list()) == []
    assert list((tmp_path / "genq" / "files").glob("file-*")) == []


def test_a_list_pages_with_after_and_limit(keyed_url: str) -> None:
    alice = client_for(keyed_url, "alice-key")
    ids = [alice.files.create(file=(f"{i}.jsonl", io.BytesIO(LINES)), purpose="batch").id for i in range(3)]
    page = alice.files.list(limit=2, order="asc")
    assert [f.id for f in page.data] == ids[:2] and page.has_more
    assert [f.id for f in alice.files.list(limit=2, order="asc", after=ids[1]).data] == ids[2:]


def test_bad_uploads_are_refused_naming_the_field(keyed_url: str, tmp_path: Path) -> None:
    alice = client_for(keyed_url, "alice-key")
    with pytest.raises(openai.BadRequestError) as purpose:
        alice.files.create(file=("a.jsonl", io.BytesIO(LINES)), purpose="fine-tune")
    assert cast(dict[str, Any], purpose.value.body)["param"] == "purpose"
    with pytest.raises(openai.BadRequestError) as name:
        alice.files.create(file=("a.csv", io.BytesIO(LINES)), purpose="batch")
    assert cast(dict[str, Any], name.value.body)["param"] == "file"
    with pytest.raises(openai.BadRequestError) as empty:
        alice.files.create(file=("a.jsonl", io.BytesIO(b"")), purpose="batch")
    assert cast(dict[str, Any], empty.value.body)["param"] == "file"
    # Over GENQ_FILE_MAX_BYTES (4096 here): 413, whether the body's length was declared or not.
    with pytest.raises(openai.APIStatusError) as large:
        alice.files.create(file=("a.jsonl", io.BytesIO(LINES * 60)), purpose="batch")
    assert large.value.status_code == 413
    body = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
        + LINES * 60 + b"\r\n--b--\r\n"
    )  # fmt: skip
    headers = {"Authorization": "Bearer alice-key", "Content-Type": "multipart/form-data; boundary=b"}
    # A generator body goes out chunked, without Content-Length.
    chunked = httpx.post(f"{keyed_url}/v1/files", headers=headers, content=iter([body[:100], body[100:]]))
    assert chunked.status_code == 413
    assert list(alice.files.list()) == []
    assert [p.name for p in (tmp_path / "genq" / "files").glob("*")] == []


def test_files_live_in_s3_when_configured(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    s3_endpoint: str,  # noqa: F811
) -> None:
    settings = make_settings(
        file_storage="s3", s3_endpoint_url=s3_endpoint, s3_bucket=BUCKET, s3_prefix="api/",
        s3_access_key_id="test", s3_secret_access_key="test",
    )  # fmt: skip
    with live_server(settings) as url:
        client = client_for(url)
        created = client.files.create(file=("r.jsonl", io.BytesIO(LINES)), purpose="batch")
        bucket = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
        stored = bucket.get_object(Bucket=BUCKET, Key=f"api/{created.id}")["Body"].read()
        assert stored == LINES
        assert client.files.content(created.id).content == LINES
        client.files.delete(created.id)
        assert bucket.list_objects_v2(Bucket=BUCKET, Prefix="api/").get("KeyCount") == 0
