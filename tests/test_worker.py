"""The engine's thread survives whatever its load raises: every request hears why, none waits
for good (before, only a LocalspecError was caught, and anything else ended the thread with
every later job left waiting: the server answered "loading" for ever)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from localspec.errors import LocalspecError
from localspec.serve.app import create_app
from localspec.worker import END, Worker

pytestmark = pytest.mark.unit


def broken_load():
    raise OSError(28, "No space left on device")


def test_a_load_that_fails_with_any_error_answers_every_job_and_the_server_says_why():
    async def main():
        worker = Worker(broken_load)
        try:
            job = worker.submit(lambda engine, cancel: [engine])
            item = await asyncio.wait_for(job.out.get(), 30)
            assert isinstance(item, LocalspecError) and "No space left on device" in str(item)
            assert await asyncio.wait_for(job.out.get(), 30) is END
            assert not worker.ready and "OSError" in worker.error
            transport = httpx.ASGITransport(app=create_app(worker))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                r = await client.get("/health")
                assert r.status_code == 503 and "No space left on device" in r.json()["error"]["message"]
                r = await client.post("/completion", json={"prompt": "hi", "n_predict": 2})
                assert r.status_code == 503 and "No space left on device" in r.json()["error"]["message"]
        finally:
            worker.close()
    asyncio.run(main())
