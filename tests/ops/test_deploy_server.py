"""The server's deployment files, held against the code: the kustomize overlays of
``deploy/kubernetes`` (rendered with ``kubectl kustomize``), the Container App of
``deploy/container-apps/server.yaml`` and the Bicep template ``deploy/azure/main.bicep``
(no Bicep compiler here: read as text). Every variable they set is a setting of
``azqueue.config`` (or azure-identity's) and the settings they make parse; every probe's
path answers 200 on a live server at the port they name; the rolling update replaces
replicas as the upgrade notes allow; the image is the Dockerfile's, tagged with this
release.

kubectl comes with the machine or from Debian (scripts/bootstrap --test); the Kubernetes
tests are skipped without it, except under CI."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from azqueue import __version__
from azqueue.config import Settings
from azqueue.config.variables import SETTINGS
from azqueue.model import upload
from tests.servers import IN_CI, Server

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "kubernetes" / "overlays").iterdir())
CONTAINER_APP = DEPLOY / "container-apps" / "server.yaml"
BICEP = DEPLOY / "azure" / "main.bicep"
# What azure-identity's DefaultAzureCredential reads to pick a user-assigned identity.
IDENTITY_VARIABLES = {"AZURE_CLIENT_ID"}
SETTING_NAMES = {s.variable for s in SETTINGS if not s.test_only}
# The image the Dockerfile builds, as scripts/image tags and pushes it.
IMAGE = re.compile(rf"^(?:[\w.-]+/)*azqueue:{re.escape(__version__)}$")


def kustomize(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        message = "kubectl is missing: scripts/bootstrap --test installs Debian's"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    done = subprocess.run([kubectl, "kustomize", str(DEPLOY / "kubernetes" / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, (kind, [d["metadata"]["name"] for d in found])
    return found[0]


def placeholder_secrets(names: set[str]) -> dict[str, str]:
    """Values for what the files take from secrets, as a deployer would set them."""
    values = {"AZQUEUE_TIP_SECRETS": secrets.token_hex(32),
              "AZQUEUE_ROOT_ACCESS_TOKEN": secrets.token_hex(32),
              "AZQUEUE_AMQP_URL": "amqps://user:password@broker.example.com/vhost",
              "AZQUEUE_STORAGE_CONNECTION_STRING": (
                  "DefaultEndpointsProtocol=https;AccountName=account;AccountKey="
                  + secrets.token_urlsafe(48) + ";EndpointSuffix=core.windows.net")}
    return {name: values[name] for name in names}


def parsed(env: dict[str, str]) -> Settings:
    """The settings a replica given ``env`` runs with (its clients file aside: it is a
    mounted secret)."""
    assert set(env) <= SETTING_NAMES | IDENTITY_VARIABLES, set(env) - SETTING_NAMES
    return Settings.from_env({k: v for k, v in env.items() if k != "AZQUEUE_CLIENTS_FILE"})


def k8s_environment(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The server container's environment: its ConfigMap's data, its own values, and
    placeholders for what it takes from the Secret."""
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]])
    from_secrets = {e["name"] for e in container["env"] if "valueFrom" in e}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    env.update(placeholder_secrets(from_secrets))
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_sets_only_real_settings_that_parse(overlay: str) -> None:
    docs = kustomize(overlay)
    settings = parsed(k8s_environment(docs))
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": settings.port, "metrics": settings.metrics_port}
    assert IMAGE.match(container["image"]), container["image"]
    assert container["command"] == ["azqueue", "serve"]
    service = one(docs, "Service")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    for ingress in (d for d in docs if d["kind"] == "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                assert path["backend"]["service"]["port"]["name"] == "http"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rolling_update_fits_the_upgrade_notes(overlay: str) -> None:
    """Replicas are replaced one at a time, a new one first, and a stopping one finishes
    its longest call (claimWork's wait) within its grace period; a drain takes one."""
    docs = kustomize(overlay)
    deployment = one(docs, "Deployment")
    notes = (ROOT / "docs" / "operating" / "upgrades.md").read_text()
    assert "Replicas can be replaced one at a time" in notes
    assert "replace all replicas together" in notes  # the alternative some steps offer
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = deployment["spec"]["template"]["spec"]
    settings = parsed(k8s_environment(docs))
    pause = int(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > pause + settings.claim_work_wait + 30
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
async def test_each_probe_answers_on_a_live_server(
        overlay: str, server: Server, anonymous: aiohttp.ClientSession) -> None:
    """Every probe's path answers 200 on the server; none is __heartbeat__, which fails
    while the broker is away, when a replica still serves."""
    container = one(kustomize(overlay), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    probes = [container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")]
    await probes_answer(server, anonymous, [(p["httpGet"]["path"], p["httpGet"]["port"])
                                            for p in probes], named={"http": 8080})


async def probes_answer(server: Server, anonymous: aiohttp.ClientSession,
                        probes: list[tuple[str, Any]], named: dict[str, int]) -> None:
    origin = server.root_url.removesuffix("/")
    for path, port in probes:
        assert named.get(port, port) == 8080, port
        assert "__heartbeat__" not in path
        async with anonymous.get(origin + path) as r:
            assert r.status == 200, (path, await r.text())


def test_the_uploads_ingress_streams_putUrls_and_the_api_one_outwaits_claimWork() -> None:
    docs = kustomize(OVERLAYS[0])
    ingresses = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Ingress"}
    uploads = ingresses["azqueue-uploads"]
    assert uploads["spec"]["rules"][0]["http"]["paths"][0]["path"] == upload.PATH + "/"
    notes = uploads["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/proxy-request-buffering"] == "off"
    assert notes["nginx.ingress.kubernetes.io/proxy-body-size"] == "0"
    wait = parsed(k8s_environment(docs)).claim_work_wait
    for ingress in ingresses.values():
        timeout = ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-read-timeout"]
        assert int(timeout) > wait


def test_workload_identity_signs_in_without_a_key_and_account_key_with_one() -> None:
    identity = kustomize("workload-identity")
    account = one(identity, "ServiceAccount")["metadata"]["annotations"]
    assert "azure.workload.identity/client-id" in account
    labels = one(identity, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels["azure.workload.identity/use"] == "true"
    settings = parsed(k8s_environment(identity))
    assert settings.storage.uses_identity
    keyed = parsed(k8s_environment(kustomize("account-key")))
    assert not keyed.storage.uses_identity


def container_app() -> dict[str, Any]:
    return yaml.safe_load(CONTAINER_APP.read_text())  # type: ignore[no-any-return]


def test_the_container_app_sets_only_real_settings_from_its_own_secrets() -> None:
    app = container_app()
    container = app["properties"]["template"]["containers"][0]
    declared = {s["name"] for s in app["properties"]["configuration"]["secrets"]}
    referenced = {e["secretRef"] for e in container["env"] if "secretRef" in e}
    referenced |= {s["secretRef"] for v in app["properties"]["template"]["volumes"]
                   for s in v.get("secrets", [])}
    assert referenced == declared
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(placeholder_secrets({e["name"] for e in container["env"] if "secretRef" in e}))
    settings = parsed(env)
    assert settings.storage.uses_identity and "AZURE_CLIENT_ID" in env
    assert app["properties"]["configuration"]["ingress"]["targetPort"] == settings.port
    assert IMAGE.match(container["image"]), container["image"]
    assert container["command"] == ["azqueue", "serve"]


async def test_the_container_apps_probes_answer_on_a_live_server(
        server: Server, anonymous: aiohttp.ClientSession) -> None:
    probes = container_app()["properties"]["template"]["containers"][0]["probes"]
    bicep = [(path, int(port)) for path, port in re.findall(
        r"path: '([^']+)'\s+port: (\d+)", BICEP.read_text())]
    assert bicep and {p["type"] for p in probes} == {"Startup", "Readiness", "Liveness"}
    await probes_answer(server, anonymous, [(p["httpGet"]["path"], p["httpGet"]["port"])
                                            for p in probes] + bicep, named={})


def test_the_bicep_template_sets_what_the_container_app_sets() -> None:
    """Read as text: its app's variables are settings (or azure-identity's), the same
    the Container App file sets (but the prefix, a parameter here), each secret it
    refers to is one it declares; the identity gets the three roles azure-storage.md
    names; the image's tag defaults to this release."""
    text = BICEP.read_text()
    env = dict(re.findall(r"\{ name: '([A-Z_]+)', (value|secretRef):", text))
    assert set(env) <= SETTING_NAMES | IDENTITY_VARIABLES, set(env) - SETTING_NAMES
    app_env = {e["name"] for e in container_app()["properties"]["template"]["containers"][0]["env"]}
    assert set(env) - {"AZQUEUE_STORAGE_PREFIX"} == app_env - {"AZQUEUE_CLIENTS_FILE"}
    refs = set(re.findall(r"secretRef: '([\w-]+)'", text))
    assert refs <= set(re.findall(r"\{ name: '([\w-]+)', value: \w+ \}", text))
    roles = (ROOT / "docs" / "operating" / "azure-storage.md").read_text()
    for role in ("Storage Table Data Contributor", "Storage Queue Data Contributor",
                 "Storage Blob Data Contributor"):
        assert role in roles and role in text
    assert re.search(rf"param imageTag string = '{re.escape(__version__)}'", text)
    assert "azqueue:${imageTag}" in text


def test_scripts_image_builds_and_pushes_the_image_the_files_name(tmp_path: Path) -> None:
    """With a docker that records its arguments: one command builds the Dockerfile's
    image with this release's tag and the checkout's commit, and pushes that tag."""
    calls = tmp_path / "calls"
    docker = tmp_path / "docker"
    docker.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    docker.chmod(0o755)
    done = subprocess.run([str(ROOT / "scripts" / "image"), "registry.example.azurecr.io"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    build, push = calls.read_text().splitlines()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    image = f"registry.example.azurecr.io/azqueue:{__version__}"
    assert build.startswith("build ") and f"COMMIT={head}" in build
    assert build.split("--tag ")[1].split()[0] == image and build.endswith(" .")
    assert push == f"push {image}"
    assert IMAGE.match(image)


def test_requests_and_limits_are_those_of_the_capacity_page() -> None:
    """The memory request and limit, and the Container Apps' requests per replica, are
    the figures docs/capacity.md derives from scripts/measure_memory.py."""
    page = (ROOT / "docs" / "capacity.md").read_text()
    request, limit, per_replica = (re.search(pattern, " ".join(page.split()))[1]  # type: ignore[index]
                                   for pattern in (r"memory request of (\d+) MiB",
                                                   r"limit of (\d+) MiB",
                                                   r"a replica per (\d+) concurrent requests"))
    for overlay in OVERLAYS:
        resources = one(kustomize(overlay), "Deployment")["spec"]["template"]["spec"][
            "containers"][0]["resources"]
        assert resources["requests"]["memory"] == f"{request}Mi"
        assert resources["limits"]["memory"] == f"{limit}Mi"
    rules = container_app()["properties"]["template"]["scale"]["rules"]
    assert [r["http"]["metadata"]["concurrentRequests"] for r in rules] == [per_replica]
    assert f"concurrentRequests: '{per_replica}'" in BICEP.read_text()
