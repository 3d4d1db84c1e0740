"""The artifact endpoints of the Queue API, and the receiver of ``s3`` uploads.

What clients read is Taskcluster's vocabulary: storage types ``s3``, ``reference``,
``link`` and ``error`` (our direct-to-Blob ``blob`` reads as ``s3``), and every answer
has the shape of the reference's schemas (post-artifact-response, artifact-response,
list-artifacts-response, get-artifact-response, artifact-content-response).

``receive_upload`` is not a Queue API method: it answers the plain ``PUT`` to an ``s3``
artifact's ``putUrl`` (docs/workers/artifacts.md), authorized by the URL's signature rather than
Hawk, and it streams the body (``azqueue.service.artifacts.uploads``) instead of reading it
whole, so it is registered with aiohttp's router (``UPLOAD_ROUTE``), ahead of the API.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from azqueue import errors
from azqueue.api.middleware import PARAMS_KEY, error_response
from azqueue.api.routing import PAGED, PARAMETERS, SERVICES_KEY, Call, Route, Routes
from azqueue.model import upload

_CREATE_ARTIFACT = "queue:create-artifact:<taskId>/<runId>"
# An artifact is read with queue:get-artifact:<name> for the name asked for and for every
# name a link leads through, as in Taskcluster (public/ names: the anonymous scopes
# grant queue:get-artifact:public/* by default, and every caller holds those).
_READ_ARTIFACT = {"AllOf": [{"for": "name", "in": "names",
                             "each": "queue:get-artifact:<name>"}]}
STORAGE_TYPE_HEADER = "x-taskcluster-artifact-storage-type"

routes = Routes("Artifacts")


@routes.declare("POST", "/task/<taskId>/runs/<runId>/artifacts/<name>", "createArtifact",
                title="Create an artifact",
                description=("`s3` (`contentType`; answers `{storageType, putUrl, expires, "
                             "contentType}`: PUT the content there, see "
                             "[Artifacts](../workers/artifacts.md)), `reference` (`url`), "
                             "`link` (`artifact`), `error` (`reason`, `message`), and our "
                             "`blob` (answers a SAS `putUrl` and the `headers` to PUT the "
                             "content with; `blobType: append` for a log written while it is "
                             "read); `object` is 400"),
                output="post-artifact-response.json",
                body="post-artifact-request.json", scopes=_CREATE_ARTIFACT)
async def create_artifact(call: Call, task_id: str, run_id: int, name: str) -> Any:
    return await call.services.artifacts.create(task_id, run_id, name, call.body)


@routes.declare("PUT", "/task/<taskId>/runs/<runId>/artifacts/<name>", "finishArtifact",
                title="Finish an artifact",
                description=("a `blob` artifact becomes readable once its content was "
                             "uploaded; 400 for every other type (nothing to finish, as in "
                             "Taskcluster)"),
                body="finish-artifact-request.json", scopes=_CREATE_ARTIFACT)
async def finish_artifact(call: Call, task_id: str, run_id: int, name: str) -> Any:
    await call.services.artifacts.finish(task_id, run_id, name)
    return {}


async def _readable(call: Call, task_id: str, run_id: int | None, name: str) -> int:
    """Check that the caller may read artifact ``name`` (before anything is read); the run
    to read it from (the latest if ``run_id`` is None). The names a link leads through are
    checked once they are known (``_may_follow``)."""
    call.authorize(names=[name])
    return await call.services.artifacts.latest_run(task_id) if run_id is None else run_id


def _may_follow(call: Call, names: tuple[str, ...]) -> None:
    """A link is read with the scopes of every artifact it leads through, as in
    Taskcluster: a public link to a private artifact needs the private one's scope."""
    call.authorize(names=list(names))


@routes.declare("GET", "/task/<taskId>/runs/<runId>/artifacts/<name>", "getArtifact",
                title="Get an artifact",
                description=("303 to a 10-minute read URL (or the reference), 424 for an error"
                             " artifact; header `x-taskcluster-artifact-storage-type`"),
                output="get-artifact-response.json", scopes=_READ_ARTIFACT)
@routes.declare("GET", "/task/<taskId>/artifacts/<name>", "getLatestArtifact",
                title="Get an artifact of the latest run",
                description="as getArtifact",
                output="get-artifact-response.json", scopes=_READ_ARTIFACT)
async def get_artifact(call: Call, task_id: str, name: str, run_id: int | None = None
                       ) -> web.StreamResponse:
    run_id = await _readable(call, task_id, run_id, name)
    target = await call.services.artifacts.target(task_id, run_id, name)
    _may_follow(call, target.names)
    a = target.artifact
    if not target.url:
        failed = error_response(call.request, errors.ArtifactFailed.status,
                                errors.ArtifactFailed.code,
                                f"artifact {a.name!r} is an error artifact: {a.reason}: "
                                f"{a.message}")
        failed.headers[STORAGE_TYPE_HEADER] = a.public_type
        return failed
    return web.json_response({"storageType": a.public_type, "url": target.url}, status=303,
                             headers={"Location": target.url, STORAGE_TYPE_HEADER: a.public_type})


@routes.declare("GET", "/task/<taskId>/runs/<runId>/artifact-info/<name>", "artifactInfo",
                title="Get an artifact's information",
                description="`{storageType, name, expires, contentType}`",
                output="artifact-response.json",
                scopes="queue:list-artifacts:<taskId>:<runId>")
@routes.declare("GET", "/task/<taskId>/artifact-info/<name>", "latestArtifactInfo",
                title="Get the information of an artifact of the latest run",
                description="as artifactInfo",
                output="artifact-response.json", scopes="queue:list-artifacts:<taskId>")
async def artifact_info(call: Call, task_id: str, name: str, run_id: int | None = None) -> Any:
    if run_id is None:
        run_id = await call.services.artifacts.latest_run(task_id)
    return (await call.services.artifacts.find(task_id, run_id, name)).info()


@routes.declare("GET", "/task/<taskId>/runs/<runId>/artifact-content/<name>", "artifact",
                title="Get an artifact's content",
                description=("`{storageType, url}` (`s3`, `reference`) or `{storageType: "
                             "error, reason, message}`, as the official client's download "
                             "helpers expect"),
                output="artifact-content-response.json", scopes=_READ_ARTIFACT)
@routes.declare("GET", "/task/<taskId>/artifact-content/<name>", "latestArtifact",
                title="Get the content of an artifact of the latest run",
                description="as artifact",
                output="artifact-content-response.json", scopes=_READ_ARTIFACT)
async def artifact_content(call: Call, task_id: str, name: str, run_id: int | None = None
                           ) -> Any:
    """The artifact-content shapes the official client's download helpers understand:
    ``s3`` and ``reference`` with a URL to GET, ``error`` with its reason and message."""
    run_id = await _readable(call, task_id, run_id, name)
    target = await call.services.artifacts.target(task_id, run_id, name)
    _may_follow(call, target.names)
    a = target.artifact
    if a.storage_type == "error":
        return {"storageType": "error", "reason": a.reason, "message": a.message}
    return {"storageType": a.public_type, "url": target.url}




@routes.declare("GET", "/task/<taskId>/runs/<runId>/artifacts", "listArtifacts",
                title="List a run's artifacts",
                description="paginated with `limit` (≤ 1000) and `continuationToken`",
                output="list-artifacts-response.json", query=PAGED,
                scopes="queue:list-artifacts:<taskId>:<runId>")
@routes.declare("GET", "/task/<taskId>/artifacts", "listLatestArtifacts",
                title="List the artifacts of the latest run",
                description="as listArtifacts",
                output="list-artifacts-response.json", query=PAGED,
                scopes="queue:list-artifacts:<taskId>")
async def list_artifacts(call: Call, task_id: str, run_id: int | None = None) -> Any:
    if run_id is None:
        run_id = await call.services.artifacts.latest_run(task_id)
    return await call.services.artifacts.list(task_id, run_id, call.continuation, call.limit())


ROUTES: list[Route] = routes.table


# -- the PUT to an s3 artifact's putUrl ---------------------------------------------------

UPLOAD_ROUTE = f"{upload.PATH}/{{tail:.+}}"
_UPLOAD_PATH = re.compile(rf"^{re.escape(upload.PATH)}/(?P<taskId>[^/]+)/(?P<runId>[^/]+)/"
                          r"(?P<name>.+)$")


async def receive_upload(request: web.Request) -> web.StreamResponse:
    """Store the body of a plain PUT to a ``putUrl`` as the artifact's content: 200 with
    the artifact's info once it is stored and present; 4xx, storing nothing, when the
    URL is not genuine or expired, or the headers or body are not what it allows."""
    if request.method != "PUT":
        raise errors.MethodNotAllowed(f"{request.method} is not allowed on an upload URL; "
                                      "PUT the artifact's content to it")
    m = _UPLOAD_PATH.match(request.raw_path.split("?", 1)[0])
    if m is None:
        raise errors.NotFound(f"{request.path} is not an upload URL: use the putUrl "
                              "createArtifact answered")
    raw = {k: unquote(v) for k, v in m.groupdict().items()}
    request[PARAMS_KEY] = raw
    values = {k: PARAMETERS[k].convert(k, v) for k, v in raw.items()}
    try:
        grant, signature = upload.UploadGrant.from_query(
            values["taskId"], values["runId"], values["name"], request.query)
    except ValueError as e:
        raise errors.InputError(f"this is not an upload URL createArtifact answered: {e}; "
                                "use the putUrl exactly as given") from None
    uploads = request.app[SERVICES_KEY].artifacts.uploads
    length = request.content_length
    uploads.check(grant, signature, request.headers.get("Content-Type"), length)
    assert length is not None  # check() refused a request without it

    async def read(size: int) -> bytes:
        try:
            return await request.content.read(size)
        except (HttpProcessingError, ConnectionError) as e:
            raise errors.InputError(f"the upload was cut off: {e}; nothing was stored"
                                    ) from None

    stored = await uploads.receive(grant, length, read,
                                   request.headers.get("Content-Encoding", ""))
    return web.json_response(stored.info())
