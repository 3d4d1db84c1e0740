"""What an Azure Storage request is, read from its head: who sent it (the server signs
with Shared Key, a worker with the SAS URLs it was handed, the background resolvers'
periodic reads apart) and what it does (``GET messages``, ``POST $batch``, …). The
fault proxy (``faultproxy``) counts every request it passes by these."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

SERVICES = ("blob", "queue", "table")


@dataclass(frozen=True, slots=True)
class Hit:
    """One kind of request: ``client`` is ``server`` (Shared Key), ``resolvers`` (the
    server's periodic reads, ``BACKGROUND``), ``workers`` (SAS), ``other``, or the label
    of the proxy's ports it came through."""

    client: str
    service: str
    kind: str


# The background resolvers' periodic reads (deadline, dependency and event triggers, the
# scan of the claim index, the doorbell table with events off): a cost per replica and
# second, not per task.
BACKGROUND = re.compile(r"^/[^/]+/[a-z0-9]+-(deadline|dependencies|events|events-leases)"
                        r"/messages\?"
                        r"|^/[^/]+/[a-z0-9]+(claims|doorbell)\(\)")


def request_kind(service: str, method: str, path: str, query: str) -> str:
    """What an Azure Storage request does, from its method and URL (path without the
    account), e.g. ``GET messages``, ``PUT message (update)``, ``POST $batch``."""
    params = {k.lower(): v for k, v in parse_qs(query, keep_blank_values=True).items()}
    comp = params.get("comp", [""])[0]
    parts = [p for p in path.split("/") if p]
    if service == "queue":
        if not parts:
            return f"{method} service ({comp or 'properties'})"
        if len(parts) == 1:
            return f"{method} queue{f' ({comp})' if comp else ''}"
        if len(parts) == 2:  # <queue>/messages
            if method == "GET":
                return "GET messages (peek)" if "peekonly" in params else "GET messages"
            return {"POST": "POST message", "DELETE": "DELETE messages (clear)"}.get(
                method, f"{method} messages")
        return {"PUT": "PUT message (update)", "DELETE": "DELETE message"}.get(
            method, f"{method} message")
    if service == "table":
        if not parts:
            return f"{method} service"
        name = unquote(parts[0])
        if name == "$batch":
            return "POST $batch"
        if name.startswith("Tables"):
            return f"{method} Tables"
        keyed = "PartitionKey=" in name and "RowKey=" in name
        if method == "GET":
            return "GET entity" if keyed else "GET query"
        return f"{method} entity"
    return f"{method} {'container' if len(parts) <= 1 else 'blob'}{f' ({comp})' if comp else ''}"


def classify(label: str, head: bytes) -> tuple[str, str, str]:
    """(client, method, target) of one request head (its request line and headers)."""
    lines = head.decode("latin-1").split("\r\n")
    method, target = (lines[0].split(" ") + ["", ""])[:2]
    if label:
        return label, method, target
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "authorization" and value.strip().startswith("SharedKey"):
            if method == "GET" and BACKGROUND.search(target):
                return "resolvers", method, target
            return "server", method, target
    return ("workers" if "sig=" in target else "other"), method, target
