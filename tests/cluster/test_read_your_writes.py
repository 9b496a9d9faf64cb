"""Read your own writes on any node, on three real nodes: a job submitted through one node and
read at once through another, with the submit's ``X-Schedd-Index`` as ``min_index``, is always
found, through a follower or the leader, many times over; and a client library reading through
another node than the one it wrote through, given the writer's ``index``, finds every job."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest

from schedd.client import AsyncClient
from tests.cluster.harness import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

ROUNDS = 300


async def test_a_job_submitted_on_one_node_is_found_at_once_on_every_other(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "c")
    try:
        cluster.start()
        async with aiohttp.ClientSession() as http:
            await cluster.wait_serving(http)
            headers = cluster.headers()
            urls = [n.url + "/api/v1" for n in cluster.nodes]
            answered: list[tuple[str, str]] = []  # (the node read, the name it answered)
            for k in range(ROUNDS):
                on, then = urls[k % 3], urls[(k + 1) % 3]
                body = orjson.dumps({"task": "t", "schedule": {"in": "1h"}, "name": f"ryw-{k}"})
                async with http.post(on + "/jobs", data=body, headers=headers) as r:
                    assert r.status == 201, await r.text()
                    index = r.headers["X-Schedd-Index"]
                    job = await r.json()
                # alternately as a query parameter and as a header
                if k % 2:
                    url, extra = f"{then}/jobs/{job['id']}?min_index={index}", {}
                else:
                    url, extra = f"{then}/jobs/{job['id']}", {"X-Schedd-Min-Index": index}
                async with http.get(url, headers={**headers, **extra}) as r:
                    assert r.status == 200, (k, r.status, await r.text())
                    assert int(r.headers["X-Schedd-Index"]) >= int(index)
                    read = await r.json()
                    assert read["id"] == job["id"]
                    answered.append((then, read["name"]))
            # every node answered reads, each with the job as it was written
            assert {node for node, _ in answered} == set(urls)
            assert [name for _, name in answered] == [f"ryw-{k}" for k in range(ROUNDS)]
            leader = await cluster.wait_serving(http)
            followers = [cluster.nodes[i].url for i in range(3) if i != leader]
            token = headers["Authorization"].removeprefix("Bearer ")
            async with (
                AsyncClient(cluster.nodes[leader].url, token=token, batching=False) as writer,
                AsyncClient(followers[0], token=token) as reader,
            ):
                for k in range(ROUNDS // 3):
                    job = await writer.submit("t", in_="1h", name=f"client-{k}")
                    assert writer.index > 0
                    reader.index = writer.index  # as a session token handed along
                    assert (await reader.get(job.id)).id == job.id
    finally:
        cluster.stop()
