"""The box's stand-in cloud, one HTTP server on port 80 of the box network namespace, reached by
every node at 169.254.169.254 (and ``metadata.google.internal``, which the nodes' /etc/hosts
points there, as GCE's own resolver does).

* ``/latest/...``: EC2 IMDSv2: ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``
  gives a token; every ``GET`` needs it in ``X-aws-ec2-metadata-token`` (401 otherwise)
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html).
* ``/computeMetadata/v1/...``: the GCE metadata server: ``Metadata-Flavor: Google`` required (403
  otherwise) and echoed; ``wait_for_change=true`` hangs up to ``timeout_sec``
  (cloud.google.com/compute/docs/metadata/querying-metadata).
* ``POST /box/cli``: the stand-in executables (``aws``, ``gcloud``, ``docker``, ``nvidia-smi``,
  ``fi_info``, ``shutdown``; :mod:`tests.box.standin`) send their argv here and get what to print.
  Cloud calls answer from the box's state: the bucket is a folder, the instances are the box's nodes.

Which node asks is the request's source address. Every request's answer depends only on the files
in the state folder (``scenario.json``, ``nodes.json``, ``bucket/``), which the test may rewrite
between requests; every CLI call is appended to ``calls.jsonl``.

Run: ``python3 server.py STATE_DIR`` (standard library only).
"""

from __future__ import annotations

import base64
import fnmatch
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

STATE = Path(sys.argv[1]) if __name__ == "__main__" else Path(".")
LOCK = threading.Lock()
#: Docker's default data-root (docs.docker.com/engine/daemon/#daemon-data-directory).
DOCKER_DEFAULT_ROOT = "/var/lib/docker"
PRECONDITION_S3 = (
    "An error occurred (PreconditionFailed) when calling the PutObject operation: At least one of "
    "the pre-conditions you specified did not hold"
)
PRECONDITION_GCS = "ERROR: HTTPError 412: At least one of the pre-conditions you specified did not hold."


def _json(name: str) -> dict:
    return json.loads((STATE / name).read_text())


def _object_path(bucket: str, key: str) -> Path:
    path = (STATE / "bucket" / bucket / key).resolve()
    if not str(path).startswith(str((STATE / "bucket").resolve()) + "/"):
        raise ValueError(f"key escapes the bucket: {key!r}")
    return path


def _split_url(url: str) -> tuple[str, str]:
    """``s3://b/k`` / ``gs://b/k`` -> (b, k)."""
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    return bucket, key


#: Suffix of an object being written (:meth:`Cli._put` renames it into place under :data:`LOCK`).
PARTIAL_SUFFIX = ".box-tmp"


def _keys(bucket: str) -> list[str]:
    """The bucket's object keys: its files, not an object still being written. Readers that also
    read the objects hold :data:`LOCK`, as the writers do, so no object vanishes or changes between
    the listing and the read (a node lists the bucket while its peer uploads)."""
    root = STATE / "bucket" / bucket
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.suffix != PARTIAL_SUFFIX)


class Cli:
    """One stand-in call: ``argv`` (program name first), ``files`` (local files the call named,
    path -> bytes), the calling ``node`` (nodes.json entry). :meth:`answer` returns
    ``(rc, stdout, stderr, writes, after)``: writes are path -> bytes the stand-in writes, after
    an argv it runs once it has printed (an orderly power-off)."""

    def __init__(self, argv: list[str], files: dict[str, bytes], stdin: bytes, node: dict, scenario: dict) -> None:
        self.argv, self.files, self.stdin, self.node, self.scenario = argv, files, stdin, node, scenario
        self.writes: dict[str, bytes] = {}
        self.after: list[str] = []
        self.exec: dict | None = None  # a job's command the stand-in execs (_docker_run_job)

    def answer(self) -> tuple[int, str, str]:
        """``(exit code, stdout, stderr)`` of the call (:attr:`writes` and :attr:`after` set as a
        side effect); a call matching one of the scenario's ``failing_calls`` exits 1 (a
        ``[pattern, n]`` entry: only this node's first ``n`` matching calls)."""
        prog = os.path.basename(self.argv[0])
        failing = self.scenario.get("failing_calls", [])
        call = f"{prog} {' '.join(self.argv[1:])}"
        for entry in failing:
            pattern, times = (entry, None) if isinstance(entry, str) else entry
            if fnmatch.fnmatch(call, pattern) and (times is None or self._earlier(pattern) < times):
                return 1, "", f"box: scenario makes this call fail ({pattern})\n"
        return getattr(self, "_" + prog.replace("-", "_"))()

    def _earlier(self, pattern: str) -> int:
        """How many of this node's recorded calls match ``pattern``."""
        path = STATE / "calls.jsonl"
        with LOCK:
            records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return sum(
            1
            for r in records
            if r["node"] == self.node["name"] and fnmatch.fnmatch(" ".join([r["argv"][0], *r["argv"][1:]]), pattern)
        )

    # ------------------------------------------------------------------ GPU and host tools
    def _nvidia_smi(self) -> tuple[int, str, str]:
        args = self.argv[1:]
        gpus = self.scenario["gpus"]
        if args[:2] == ["nvlink", "-s"]:
            return 0, gpus["nvlink_status"], ""
        if args and args[0] == "--query-gpu=power.draw,enforced.power.limit":
            limit = gpus.get("power_limit_w", 700.0)
            power = gpus.get("power_w") or [None] * len(gpus["utilization"])
            return 0, "".join(f"{'[N/A]' if p is None else f'{p:.2f}'}, {limit:.2f}\n" for p in power), ""
        if args and args[0].startswith("--query-gpu=utilization.gpu"):
            return 0, "".join(f"{u}\n" for u in gpus["utilization"]), ""
        if args and args[0].startswith("--query-gpu="):
            return 0, gpus["query"], ""
        return 0, "", ""

    def _fi_info(self) -> tuple[int, str, str]:
        text = self.scenario["gpus"].get("fi_info")
        return (0, text, "") if text else (1, "", "fi_getinfo: -61 (No data available)\n")

    #: Docker's data-root on the calling node (the stand-in reads /etc/docker/daemon.json).
    docker_root = "/var/lib/docker"

    def _images(self, add: str | None = None) -> set[str]:
        """The node's local images (``images/<node>``, one per line; ``images/<node><data-root with
        / as _>`` for a data-root other than Docker's default: a moved data-root starts empty, as
        dockerd's does); ``add`` one first."""
        name = self.node["name"]
        if self.docker_root != DOCKER_DEFAULT_ROOT:
            name += self.docker_root.replace("/", "_")
        path = STATE / "images" / name
        with LOCK:
            images = set(path.read_text().split()) if path.exists() else set()
            if add:
                images.add(add)
                path.parent.mkdir(exist_ok=True)
                path.write_text("".join(f"{i}\n" for i in sorted(images)))
        return images

    def _docker(self) -> tuple[int, str, str]:
        args = self.argv[1:]
        # the node's image store: absent until pulled, tagged or built (docker image inspect exits 1)
        if args[:2] == ["image", "inspect"]:
            found = args[2] in self._images()
            return (0, "[]\n", "") if found else (1, "[]\n", f"Error: No such image: {args[2]}\n")
        if args[:1] == ["pull"]:
            self._images(add=args[-1])
        elif args[:1] == ["tag"]:
            self._images(add=args[2])
        elif args[:1] == ["build"] and "--tag" in args:
            self._images(add=args[args.index("--tag") + 1])
        if args[:1] == ["run"] and any(a.endswith("gpuinfra_allreduce.py") for a in args):
            return 0, self.scenario["gpus"]["all_reduce"], ""
        if args[:1] == ["run"] and "torchrun" in args:
            return self._docker_run_job(args[1:])
        if args[:1] == ["logs"]:
            return 0, "Buffer manager initialization complete\n", ""
        return 0, "", ""

    #: ``docker run`` options that take a value (the ones ``gpuinfra-run`` passes).
    DOCKER_RUN_VALUE_OPTIONS = frozenset(
        (
            "--name",
            "--entrypoint",
            "--ulimit",
            "--cap-add",
            "--device",
            "-v",
            "-w",
            "--env-file",
            "--gpus",
            "--network",
            "--ipc",
        )
    )

    def _docker_run_job(self, args: list[str]) -> tuple[int, str, str]:
        """A training job's ``docker run [OPTIONS] IMAGE COMMAND...``: the stand-in execs COMMAND
        on the node itself (the box has no containers), with the variables of ``--env-file``
        (sent by the stand-in; docs.docker.com/reference/cli/docker/container/run/#env: one
        ``KEY=VALUE`` per line) and ``-w``'s working folder."""
        opts: dict[str, str] = {}
        i = 0
        while i < len(args) and args[i].startswith("-"):
            if args[i] in self.DOCKER_RUN_VALUE_OPTIONS:
                opts[args[i]] = args[i + 1]
                i += 2
            else:
                i += 1
        command = args[i + 1 :]
        text = self.files.get(opts.get("--env-file", ""), b"").decode()
        env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        self.exec = {"argv": command, "env": env, "cwd": opts.get("-w", "/")}
        return 0, "", ""

    def _shutdown(self) -> tuple[int, str, str]:
        self.after = ["/usr/sbin/shutdown", *self.argv[1:]]  # the real one, after the call is recorded
        return 0, "", ""

    # ------------------------------------------------------------------ AWS CLI
    def _aws(self) -> tuple[int, str, str]:
        args = [a for a in self.argv[1:] if a not in ("--only-show-errors", "--quiet")]
        if "--region" in args:
            i = args.index("--region")
            del args[i : i + 2]
        if args[:2] == ["ec2", "describe-instances"]:
            ips = [n["ip"] for n in _json("nodes.json")["nodes"] if n["state"] in ("pending", "running")]
            return 0, "\t".join(ips) + "\n", ""
        if args[:2] == ["ecr", "get-login-password"]:  # a token for `docker login --password-stdin`
            return 0, "box-ecr-token\n", ""
        if args[:2] == ["s3", "cp"]:
            return self._copy(args[2:], "s3")
        if args[:2] == ["s3", "sync"]:
            return self._sync(args[2:], "s3")
        if args[:2] == ["s3api", "put-object"]:
            opts = dict(zip(args[2::2], args[3::2], strict=False))
            target = _object_path(opts["--bucket"], opts["--key"])
            with LOCK:
                if opts.get("--if-none-match") == "*" and target.exists():
                    return 254, "", PRECONDITION_S3 + "\n"
                self._put(target, self.files[opts["--body"]])
            return 0, '{"ETag": "\\"box\\""}\n', ""
        return 2, "", f"box: aws {' '.join(args)} is not stood in\n"

    # ------------------------------------------------------------------ gcloud
    def _gcloud(self) -> tuple[int, str, str]:
        args = [a for a in self.argv[1:] if a != "--quiet"]
        if args[:2] == ["storage", "cp"]:
            rest = args[2:]
            create_only = "--if-generation-match=0" in rest
            rest = [a for a in rest if a != "--if-generation-match=0"]
            return self._copy(rest, "gs", create_only)
        if args[:2] == ["storage", "rsync"]:
            return self._sync([a for a in args[2:] if a != "--recursive"], "gs")
        if args[:2] == ["storage", "rm"]:
            bucket, pattern = _split_url(args[2])
            with LOCK:
                for key in _keys(bucket):
                    if fnmatch.fnmatch(key, pattern.replace("**", "*")):
                        _object_path(bucket, key).unlink()
            return 0, "", ""
        if args[:2] == ["storage", "ls"]:
            bucket, pattern = _split_url(args[2])
            found = [f"gs://{bucket}/{k}" for k in _keys(bucket) if fnmatch.fnmatch(k, pattern.replace("**", "*"))]
            if not found:
                return 1, "", "ERROR: (gcloud.storage.ls) One or more URLs matched no objects.\n"
            return 0, "".join(f"{u}\n" for u in found), ""
        if args[:4] == ["compute", "instance-groups", "managed", "list-instances"]:
            # the group's members only: the VMs of a bulk insert are not members
            nodes = _json("nodes.json")["nodes"]
            running = [n["name"] for n in nodes if n["state"] == "running" and n.get("mig", True)]
            return 0, "".join(f"{n}\n" for n in running), ""
        if args[:3] == ["compute", "instances", "describe"]:
            # a terminated VM is gone (DELETE on preemption, or deleted): gcloud's 404 message
            found = [n for n in _json("nodes.json")["nodes"] if n["name"] == args[3] and n["state"] == "running"]
            if not found:
                return (
                    1,
                    "",
                    (
                        "ERROR: (gcloud.compute.instances.describe) Could not fetch resource:\n"
                        f" - The resource 'projects/box/zones/box/instances/{args[3]}' was not found\n"
                    ),
                )
            return 0, "RUNNING\n", ""
        if args[:3] == ["compute", "instances", "delete"] and args[3] == self.node["name"]:
            # GCE stops the VM (an ACPI power-off the guest handles) and deletes it
            self.after = ["/usr/bin/systemctl", "poweroff", "--no-block"]
            return 0, "", ""
        if args[:4] == ["compute", "instance-groups", "managed", "create-instance"]:
            return 0, "", ""  # recorded: the test boots the replacement it names
        if args[:4] == ["compute", "instance-groups", "managed", "delete-instances"]:
            # GCE stops the VM (an ACPI power-off the guest handles) and the group shrinks
            self.after = ["/usr/bin/systemctl", "poweroff", "--no-block"]
            return 0, "", ""
        if args[:4] == ["compute", "instance-groups", "managed", "resize"]:
            return 0, "", ""
        if args[:2] == ["auth", "configure-docker"]:
            return 0, "", ""
        return 2, "", f"box: gcloud {' '.join(args)} is not stood in\n"

    # ------------------------------------------------------------------ bucket copies
    def _put(self, target: Path, body: bytes) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + PARTIAL_SUFFIX)
        tmp.write_bytes(body)
        os.replace(tmp, target)

    def _sync(self, args: list[str], scheme: str) -> tuple[int, str, str]:
        """``aws s3 sync SRC DST`` / ``gcloud storage rsync --recursive SRC DST``: a folder to a
        prefix (every file the stand-in sent from under SRC) or a prefix to a folder."""
        src, dst = args
        if dst.startswith(f"{scheme}://"):
            bucket, prefix = _split_url(dst)
            root = src.rstrip("/") + "/"
            with LOCK:
                for path, body in self.files.items():
                    if path.startswith(root):
                        self._put(_object_path(bucket, f"{prefix.rstrip('/')}/{path[len(root) :]}"), body)
            return 0, "", ""
        bucket, prefix = _split_url(src)
        prefix = prefix.rstrip("/") + "/"
        with LOCK:
            for key in _keys(bucket):
                if key.startswith(prefix):
                    self.writes[f"{dst.rstrip('/')}/{key[len(prefix) :]}"] = _object_path(bucket, key).read_bytes()
        return 0, "", ""

    def _copy(self, args: list[str], scheme: str, create_only: bool = False) -> tuple[int, str, str]:
        recursive = "--recursive" in args
        src, dst = [a for a in args if a != "--recursive"]
        if dst.startswith(f"{scheme}://"):  # upload
            body = self.stdin if src == "-" else self.files.get(src)
            if body is None:
                return 1, "", f"box: {src} is not a readable file\n"
            target = _object_path(*_split_url(dst))
            with LOCK:
                if create_only and target.exists():
                    return 1, "", PRECONDITION_GCS + "\n"
                self._put(target, body)
            return 0, "", ""
        bucket, key = _split_url(src)
        if recursive:
            prefix = key.rstrip("*")
            with LOCK:
                keys = [k for k in _keys(bucket) if k.startswith(prefix)]
                for k in keys:
                    self.writes[f"{dst}/{k[len(prefix) :].lstrip('/')}"] = _object_path(bucket, k).read_bytes()
            if not keys and scheme == "gs":
                return 1, "", "ERROR: (gcloud.storage.cp) The following URLs matched no objects or files:\n"
            return 0, "", ""
        path = _object_path(bucket, key)
        if not path.is_file():
            msg = (
                "fatal error: An error occurred (404) when calling the HeadObject operation: Not Found"
                if scheme == "s3"
                else "ERROR: (gcloud.storage.cp) The following URLs matched no objects or files:"
            )
            return 1, "", msg + "\n"
        if dst == "-":
            return 0, path.read_text(), ""
        self.writes[dst] = path.read_bytes()
        return 0, "", ""


class Handler(BaseHTTPRequestHandler):
    """Routes IMDS, GCE metadata and stand-in calls (see the module docstring)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args) -> None:
        """Quiet: the call log is the record."""

    def _node(self) -> dict | None:
        for node in _json("nodes.json")["nodes"]:
            if node["ip"] == self.client_address[0]:
                return node
        return None

    def _send(self, status: int, body: str | bytes, headers: dict | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        """IMDSv2 session token (``PUT /latest/api/token``); 400 for anything else."""
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            node = self._node()
            return self._send(200, f"box-token-{node['name'] if node else 'unknown'}")
        return self._send(400, "")

    def do_GET(self) -> None:  # noqa: N802
        """IMDS (token required) and GCE metadata (``Metadata-Flavor: Google`` required) reads."""
        node = self._node()
        url = urlsplit(self.path)
        if node is None:
            return self._send(404, "not a box node")
        scenario = _json("scenario.json")
        if url.path.startswith("/latest/meta-data/"):
            if self.headers.get("X-aws-ec2-metadata-token") != f"box-token-{node['name']}":
                return self._send(401, "")
            value = self._imds(url.path[len("/latest/meta-data/") :], node, scenario)
            return self._send(200, value) if value is not None else self._send(404, "")
        if url.path.startswith("/computeMetadata/v1/"):
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(403, "Missing Metadata-Flavor:Google header.")
            query = parse_qs(url.query)
            value = self._gce(url.path[len("/computeMetadata/v1/") :], node, scenario)
            if value is None:
                return self._send(404, "")
            if query.get("wait_for_change") == ["true"] and query.get("last_etag") == [_etag(value)]:
                time.sleep(min(float(query.get("timeout_sec", ["5"])[0]), 10.0))
                value = self._gce(url.path[len("/computeMetadata/v1/") :], node, _json("scenario.json")) or ""
            return self._send(200, value, {"Metadata-Flavor": "Google", "ETag": _etag(value)})
        return self._send(404, "")

    def do_POST(self) -> None:  # noqa: N802
        """A stand-in call (``/box/cli``): answer it, append it to ``calls.jsonl``."""
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length))
        node = self._node() or {"name": "unknown", "ip": self.client_address[0]}
        files = {k: base64.b64decode(v) for k, v in request.get("files", {}).items()}
        cli = Cli(request["argv"], files, base64.b64decode(request.get("stdin", "")), node, _json("scenario.json"))
        cli.docker_root = request.get("docker_root") or DOCKER_DEFAULT_ROOT
        try:
            rc, out, err = cli.answer()
        except Exception as exc:  # noqa: BLE001 - the stand-in prints it; the call log keeps it
            rc, out, err = 70, "", f"box: stand-in error: {exc!r}\n"
        record = {"t": time.time(), "node": node["name"], "argv": request["argv"], "rc": rc}
        with LOCK, open(STATE / "calls.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")
        self._send(
            200,
            json.dumps(
                {
                    "rc": rc,
                    "stdout": out,
                    "stderr": err,
                    "after": cli.after,
                    "exec": cli.exec,
                    "writes": {k: base64.b64encode(v).decode() for k, v in cli.writes.items()},
                }
            ),
            {"Content-Type": "application/json"},
        )

    @staticmethod
    def _imds(path: str, node: dict, scenario: dict) -> str | None:
        aws = scenario.get("aws", {})
        values = {
            "instance-id": node["id"],
            "local-ipv4": node["ip"],
            "placement/region": aws.get("region", ""),
            "placement/availability-zone": aws.get("zone", ""),
            "placement/availability-zone-id": aws.get("zone_id", ""),
        }
        values.update({f"tags/instance/{k}": v for k, v in aws.get("tags", {}).items()})
        notices = node.get("notices", {})
        if "spot" in notices:
            values["spot/instance-action"] = json.dumps(notices["spot"])
        if "rebalance" in notices:
            values["events/recommendations/rebalance"] = json.dumps(notices["rebalance"])
        return values.get(path.rstrip("/"))

    @staticmethod
    def _gce(path: str, node: dict, scenario: dict) -> str | None:
        gcp = scenario.get("gcp", {})
        values = {
            "instance/name": node["name"],
            "instance/hostname": f"{node['name']}.c.box.internal",
            "instance/id": node["id"],
            "instance/zone": f"projects/1234567890/zones/{gcp.get('zone', '')}",
            "instance/network-interfaces/0/ip": node["ip"],
            "instance/preempted": "TRUE" if "preempted" in node.get("notices", {}) else "FALSE",
        }
        if node.get("mig", True):  # only VMs a managed instance group created carry it: the group's URL
            group = node["name"].rsplit("-", 1)[0]
            values["instance/attributes/created-by"] = (
                f"projects/1234567890/zones/{gcp.get('zone', '')}/instanceGroupManagers/{group}"
            )
        values.update({f"instance/attributes/{k}": v for k, v in gcp.get("attributes", {}).items()})
        return values.get(path.rstrip("/"))


def _etag(value: str) -> str:
    import hashlib

    return hashlib.sha256(value.encode()).hexdigest()[:16]


def main() -> None:
    """Serve on 0.0.0.0:80 until killed; writes ``ready`` into the state folder once listening."""
    server = ThreadingHTTPServer(("0.0.0.0", 80), Handler)
    server.daemon_threads = True
    (STATE / "ready").write_text(str(os.getpid()))
    server.serve_forever()


if __name__ == "__main__":
    main()
