"""With anonymous reads off (``AZQUEUE_ANONYMOUS_SCOPES=``), the dashboard's recent
changes tell an anonymous caller nothing: neither the resolutions per minute nor which
task queues exist. A caller holding the scopes of the API reads that tell as much
(listTaskQueues, getTaskQueue) reads them."""

from __future__ import annotations

import aiohttp
import mohawk

from azqueue.config import Client
from azqueue.testing.tasks import create, definition
from tests.servers import ServerFactory

READER = Client("reader", "reader-access-token-0123456789ab", (
    "queue:get-task-queue:prov/secret", "queue:status:*"))


async def test_recent_changes_need_the_scopes_of_the_task_queue_reads(
        make_server: ServerFactory, http: aiohttp.ClientSession,
        anonymous: aiohttp.ClientSession) -> None:
    server = await make_server(anonymous_scopes=(), clients=(READER,))
    task_id = await create(http, server.api, definition("prov/secret"))
    async with http.post(f"{server.api}/task/{task_id}/cancel") as r:
        assert r.status == 200, await r.text()
    recent = f"{server.root_url}/dashboard/recent"
    for query in ("", "?taskQueueId=prov/secret", "?taskQueueId=prov/none"):
        async with anonymous.get(recent + query) as r:
            assert r.status == 403, await r.text()
            body = await r.json()
            assert body["code"] == "InsufficientScopes"
            assert "throughput" not in body and "tasks" not in body
    async with anonymous.get(recent + "?taskQueueId=prov/secret",
                             headers=_signed(READER, recent + "?taskQueueId=prov/secret")) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    assert [t["taskId"] for t in answer["tasks"]] == [task_id]
    assert answer["throughput"]
    # Every task queue's: listTaskQueues' scope, which the reader lacks.
    async with anonymous.get(recent, headers=_signed(READER, recent)) as r:
        assert r.status == 403, await r.text()


def _signed(client: Client, url: str) -> dict[str, str]:
    """The Authorization header of a GET of ``url`` as ``client`` (the dashboard signs its
    reads of the recent changes as the operator who signed in)."""
    sender = mohawk.Sender({"id": client.client_id, "key": client.access_token,
                            "algorithm": "sha256"}, url, "GET", always_hash_content=False)
    return {"Authorization": sender.request_header}
