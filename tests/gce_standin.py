"""A stateful Compute Engine REST stand-in on 127.0.0.1 for the real google-cloud-compute client.

It answers, in the documented JSON shapes (cloud.google.com/compute/docs/reference/rest/v1):
``instances.bulkInsert`` (POST ``.../zones/{zone}/instances/bulkInsert``), ``instances.get`` /
``instances.delete`` (GET / DELETE ``.../instances/{name}``), ``instances.list`` (GET
``.../instances``, ``filter`` ``name eq <regex>``) and ``zoneOperations.get`` / ``wait``
(GET ``.../operations/{op}``, POST ``.../operations/{op}/wait``). How a bulk insert ends is set by
the test (:class:`Capacity`): every VM, ``k`` VMs then an operation error, or ``k`` VMs and an
operation that stays ``RUNNING``; a refusal of the call itself is an HTTP error body. Every request
is recorded (method, path, JSON body).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote_plus

_PATH = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/(?P<rest>.+)$")


@dataclass
class Capacity:
    """How the next bulk insert ends.

    Attributes:
        creates: VMs it creates (None: every one asked for).
        error: the operation's error code when it ends (None: no error).
        running: the operation never reaches DONE.
        refuse: (HTTP status, reason) of a refused call: nothing is created, no operation.
        late: with ``running``, once the caller deleted one of the VMs (it gave up), each read of
            the operation creates one more of its VMs, until every one exists.
        ends_after_reads: with ``running``, the operation ends (DONE, with ``error``) at this
            read after the caller's first delete (None: never).
    """

    creates: int | None = None
    error: str | None = None
    running: bool = False
    refuse: tuple[int, str] | None = None
    late: bool = False
    ends_after_reads: int | None = None


@dataclass
class ComputeStandin:
    """The server and its state: ``instances`` name -> instance JSON; ``operations`` name -> JSON."""

    capacity: Capacity = field(default_factory=Capacity)
    instances: dict[str, dict] = field(default_factory=dict)
    operations: dict[str, dict] = field(default_factory=dict)
    requests: list[tuple[str, str, dict]] = field(default_factory=list)
    deleted: bool = False
    #: name -> how many of its next deletes are refused with HTTP 400 ``resourceNotReady`` (an
    #: instance whose own operation is not done yet: "The resource ... is not ready", reported for
    #: Compute instances in github.com/googleapis/google-cloud-java/issues/9312)
    refuse_deletes: dict[str, int] = field(default_factory=dict)
    #: managed instance groups: name -> the names of their VMs (in :attr:`instances` too)
    groups: dict[str, list[str]] = field(default_factory=dict)
    #: how many of the next ``zoneOperations.get`` are refused with HTTP 403 ``rateLimitExceeded``
    #: (Compute's rate limit: "Error 403: Quota exceeded for quota group ..., rateLimitExceeded",
    #: github.com/hashicorp/terraform-provider-google/issues/8360; not retried by the client)
    refuse_operation_reads: int = 0
    #: the message of a refused bulk insert (:attr:`Capacity.refuse`; None: ``<reason>: refused``)
    refusal_message: str | None = None
    #: the ``filter`` of every ``instances.list`` call, in order
    lists: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        standin = self
        self._lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else {}
                path, _, query = self.path.partition("?")
                if query:  # e.g. instanceGroupManagers.resize?size=0
                    body = {**body, "__query__": dict(p.split("=", 1) for p in query.split("&") if "=" in p)}
                standin.requests.append((method, path, body))
                with standin._lock:
                    status, payload = standin.answer(method, path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._serve("GET")

            def do_POST(self):  # noqa: N802
                self._serve("POST")

            def do_DELETE(self):  # noqa: N802
                self._serve("DELETE")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ComputeStandin:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- the API ------------------------------------------------------------------------------------
    def _operation(self, zone: str, kind: str, target: str, done: bool, error: str | None = None) -> dict:
        name = f"operation-{len(self.operations) + 1}"
        op = {
            "kind": "compute#operation",
            "name": name,
            "zone": zone,
            "operationType": kind,
            "targetLink": target,
            "status": "DONE" if done else "RUNNING",
        }
        if error:
            op["error"] = {"errors": [{"code": error, "message": f"{error} (stand-in)"}]}
        self.operations[name] = op
        return op

    def _advance(self, op: dict, zone: str) -> None:
        """One read of a running bulk insert: maybe a late VM, maybe the end (:class:`Capacity`)."""
        cap = self.capacity
        if not self.deleted:
            return
        op["_reads"] += 1
        if cap.late and op["_pending"]:
            name = op["_pending"].pop(0)
            self.instances[name] = {"kind": "compute#instance", "name": name, "zone": zone, "status": "PROVISIONING"}
        if cap.ends_after_reads is not None and op["_reads"] >= cap.ends_after_reads:
            op["status"] = "DONE"
            if cap.error:
                op["error"] = {"errors": [{"code": cap.error, "message": f"{cap.error} (stand-in)"}]}

    def _list(self, expr: str) -> dict:
        """``instances.list`` of the zone with ``filter``: ``name eq <literal>`` (quoted or not),
        "The literal value is interpreted as a regular expression using Google RE2 library
        syntax. The literal value must match the entire field" (.../rest/v1/instances/list); no
        filter lists every VM. One page (``items``)."""
        names = sorted(self.instances)
        if expr:
            found = re.fullmatch(r"""\s*name\s+eq\s+(?:'([^']*)'|"([^"]*)"|(\S+))\s*""", expr)
            if found is None:
                raise ValueError(f"stand-in: filter {expr!r} is not stood in")
            pattern = next(g for g in found.groups() if g is not None)
            names = [n for n in names if re.fullmatch(pattern, n)]
        self.lists.append(expr)
        return {"kind": "compute#instanceList", "items": [self.instances[n] for n in names]}

    @staticmethod
    def _not_found(what: str) -> tuple[int, dict]:
        return 404, {"error": {"code": 404, "message": f"The resource '{what}' was not found", "errors": []}}

    def answer(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        """(HTTP status, JSON) of one request."""
        match = _PATH.match(path)
        if match is None:
            return self._not_found(path)
        zone, rest = match["zone"], match["rest"]
        if method == "POST" and rest == "instances/bulkInsert":
            cap = self.capacity
            if cap.refuse:
                status, reason = cap.refuse
                message = self.refusal_message or f"{reason}: refused (stand-in)"
                return status, {
                    "error": {"code": status, "message": message, "errors": [{"reason": reason, "message": message}]}
                }
            names = sorted(body.get("perInstanceProperties") or {})
            made = names if cap.creates is None else names[: cap.creates]
            for name in made:
                self.instances[name] = {
                    "kind": "compute#instance",
                    "name": name,
                    "zone": zone,
                    "status": "PROVISIONING" if cap.running else "RUNNING",
                    "sourceInstanceTemplate": body.get("sourceInstanceTemplate", ""),
                }
            op = self._operation(
                zone, "bulkInsert", path, done=not cap.running, error=None if cap.running else cap.error
            )
            op["_pending"], op["_reads"] = names[len(made) :], 0
            return 200, {k: v for k, v in op.items() if not k.startswith("_")}
        if rest.startswith("operations/"):
            name = rest.split("/")[1]
            if self.refuse_operation_reads > 0:
                self.refuse_operation_reads -= 1
                message = "Quota exceeded for quota group 'OperationReadGroup' (stand-in)"
                return 403, {"error": {"code": 403, "message": message, "errors": [{"reason": "rateLimitExceeded"}]}}
            op = self.operations.get(name)
            if op is None:
                return self._not_found(name)
            if op["status"] == "RUNNING":
                self._advance(op, zone)
            return 200, {k: v for k, v in op.items() if not k.startswith("_")}
        if method == "POST" and rest.startswith("instanceGroupManagers/") and rest.endswith("/resize"):
            group = rest.split("/")[1]
            if group not in self.groups:
                return self._not_found(group)
            size = int((body.get("__query__") or {}).get("size", "-1"))
            for name in self.groups[group][size:]:  # a resize down deletes the group's VMs over the size
                self.instances.pop(name, None)
            del self.groups[group][size:]
            return 200, self._operation(zone, "compute.instanceGroupManagers.resize", path, done=True)
        if method == "GET" and rest == "instances":
            return 200, self._list(unquote_plus((body.get("__query__") or {}).get("filter", "")))
        if rest.startswith("instances/"):
            name = rest.split("/", 1)[1]
            if name not in self.instances:
                return self._not_found(name)
            if method == "GET":
                return 200, self.instances[name]
            if method == "DELETE" and self.refuse_deletes.get(name, 0) > 0:
                self.refuse_deletes[name] -= 1
                message = f"The resource '{name}' is not ready"
                return 400, {"error": {"code": 400, "message": message, "errors": [{"reason": "resourceNotReady"}]}}
            if method == "DELETE":
                self.deleted = True
                del self.instances[name]
                return 200, self._operation(zone, "delete", path, done=True)
        return self._not_found(path)
