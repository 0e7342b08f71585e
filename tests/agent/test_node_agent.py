"""The node agent against a local metadata server, moto S3 on 127.0.0.1 and a fake NVML."""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuinfra.agent import checkpoints as ck
from gpuinfra.agent.constants import CHECKPOINT_COMPLETE_MARKER
from gpuinfra.agent.node import (
    Agent,
    AgentConfig,
    AwsMetadata,
    GcpMetadata,
    NvmlGpus,
    end_gcp_node,
    node_name,
)
from gpuinfra.agent.replace import request_gcp_replacement
from tests.agent.fakecli import FakeCli

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class MetadataServer:
    """IMDSv2 (token required) and GCE metadata (Metadata-Flavor required) on 127.0.0.1."""

    def __init__(self):
        self.spot_action = None
        self.preempted = False
        self.expires_tag = None
        self.fail_status = None  # every request answered with this HTTP status (403, 500)
        self.created_by = 404  # instance/attributes/created-by: 200 (a MIG member, its URL) or this status
        self.changed = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code, body=""):
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):  # noqa: N802
                if server.fail_status:
                    return self._send(server.fail_status)
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, "token-123")
                return self._send(400)

            def do_GET(self):  # noqa: N802
                if server.fail_status:
                    return self._send(server.fail_status)
                if self.path.startswith("/latest/"):
                    if self.headers.get("X-aws-ec2-metadata-token") != "token-123":
                        return self._send(401)
                    if self.path == "/latest/meta-data/spot/instance-action":
                        return (
                            self._send(200, json.dumps(server.spot_action)) if server.spot_action else self._send(404)
                        )
                    if self.path == "/latest/meta-data/tags/instance/gpuinfra:expires-at":
                        return self._send(200, server.expires_tag) if server.expires_tag else self._send(404)
                    if self.path == "/latest/meta-data/instance-id":
                        return self._send(200, "i-0abc")
                    return self._send(404)
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._send(403)
                if self.path.startswith("/computeMetadata/v1/instance/preempted"):
                    return self._preempted()
                if self.path == "/computeMetadata/v1/instance/name":
                    return self._send(200, "t-2-node-x7q2")
                if self.path == "/computeMetadata/v1/instance/zone":
                    return self._send(200, "projects/123/zones/us-central1-a")
                if self.path == "/computeMetadata/v1/instance/attributes/created-by":
                    url = "projects/123/zones/us-central1-a/instanceGroupManagers/t-2-node"
                    return self._send(200, url) if server.created_by == 200 else self._send(server.created_by)
                return self._send(404)

            def _preempted(self):
                # querying-metadata#waitforchange: with wait_for_change and a last_etag equal to
                # the current ETag, hang until the value changes or timeout_sec passes
                from urllib.parse import parse_qs, urlparse

                query = parse_qs(urlparse(self.path).query)
                with server.changed:
                    if query.get("wait_for_change") == ["true"] and query.get("last_etag") == [server.etag()]:
                        server.changed.wait_for(
                            lambda: query["last_etag"] != [server.etag()],
                            timeout=float(query.get("timeout_sec", ["60"])[0]),
                        )
                    value = "TRUE" if server.preempted else "FALSE"
                    etag = server.etag()
                data = value.encode()
                self.send_response(200)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def etag(self):
        return "etag-preempted" if self.preempted else "etag-running"

    def preempt(self):
        with self.changed:
            self.preempted = True
            self.changed.notify_all()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metadata():
    server = MetadataServer()
    yield server
    server.close()


class FakeGpus:
    def __init__(self, *values):
        self.values = list(values)

    def utilizations(self):
        return list(self.values)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _config(tmp_path, **kw):
    values = dict(
        cloud="aws",
        stack="t",
        bucket="b",
        expires_at=NOW + timedelta(hours=5),
        idle_timeout_seconds=1800,
        idle_utilization_percent=5,
        checkpoint_dir=tmp_path / "ckpt",
        dry_run=False,
    )
    values.update(kw)
    return AgentConfig(**values)


def _sync(tmp_path, cli, node="i-0abc", stack="t"):
    """The real checkpoint sync over a fake CLI; the agent's ``syncer`` factory."""
    sync = ck.CheckpointSync(
        tmp_path / "ckpt",
        ck.Bucket("aws", "b", run=cli),
        stack,
        node,
        state_file=tmp_path / f"{node}.json",
        cluster_env=tmp_path / "no-cluster.env",
    )
    return lambda: sync


def _complete(tmp_path, name="step-100", body=b"weights"):
    folder = tmp_path / "ckpt" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.pt").write_bytes(body)
    (folder / CHECKPOINT_COMPLETE_MARKER).write_text("")
    return folder


def test_aws_spot_notice_syncs_checkpoints_and_does_not_end_the_node(tmp_path, metadata):
    cli = FakeCli()
    _complete(tmp_path)
    ended = []
    agent = Agent(
        _config(tmp_path), FakeGpus(90), AwsMetadata(metadata.url), _sync(tmp_path, cli), ended.append, now=lambda: NOW
    )
    assert agent.step() == "running"
    metadata.spot_action = {"action": "terminate", "time": "2026-11-22T12:02:00Z"}
    assert agent.step() == "interrupted"
    assert json.loads(cli.objects["b/checkpoints/t/node-i-0abc/LATEST"])["checkpoint"] == "step-100"
    assert ended == []  # EC2 reclaims the instance itself


def test_idle_for_the_timeout_syncs_then_ends_the_node(tmp_path, metadata):
    cli = FakeCli()
    _complete(tmp_path, "final")
    clock, ended = Clock(), []
    agent = Agent(
        _config(tmp_path),
        FakeGpus(2, 0, 1, 3),
        AwsMetadata(metadata.url),
        _sync(tmp_path, cli),
        ended.append,
        clock=clock,
        now=lambda: NOW,
    )
    assert agent.step() == "running"  # idle starts now
    clock.t += 1799
    assert agent.step() == "running" and ended == []
    clock.t += 1
    assert agent.step() == "idle"
    assert ended == ["idle"] and json.loads(cli.objects["b/checkpoints/t/node-i-0abc/LATEST"])["checkpoint"] == "final"
    assert any("all GPUs under 5% for 30 min" in e for e in agent.events)


def test_one_busy_gpu_resets_the_idle_clock(tmp_path, metadata):
    clock, ended = Clock(), []
    gpus = FakeGpus(0, 0, 0, 0)
    agent = Agent(_config(tmp_path), gpus, AwsMetadata(metadata.url), None, ended.append, clock=clock, now=lambda: NOW)
    agent.step()
    clock.t += 1500
    gpus.values = [0, 97, 0, 0]
    assert agent.step() == "running" and agent.idle_since is None
    gpus.values = [0, 0, 0, 0]
    agent.step()
    clock.t += 1700
    assert agent.step() == "running" and ended == []


def test_ttl_from_the_instance_tag_wins_and_ends_the_node(tmp_path, metadata):
    ended = []
    metadata.expires_tag = "2026-11-22T11:59:00Z"  # tag says expired; node.env says 5 h left
    agent = Agent(_config(tmp_path), FakeGpus(100), AwsMetadata(metadata.url), None, ended.append, now=lambda: NOW)
    assert agent.step() == "expired" and ended == ["expired"]


def test_dry_run_only_logs(tmp_path, metadata):
    ended = []
    agent = Agent(
        _config(tmp_path, expires_at=NOW - timedelta(minutes=1), dry_run=True),
        FakeGpus(0),
        AwsMetadata(metadata.url),
        None,
        ended.append,
        now=lambda: NOW,
    )
    assert agent.step() == "expired" and ended == []
    assert agent.events[-1] == "dry run: not ending the node"


def test_gcp_preemption_and_identity(tmp_path, metadata):
    gcp = GcpMetadata(metadata.url + "/computeMetadata/v1")
    assert gcp.interruption() is None
    metadata.preempted = True
    assert gcp.interruption() == {"action": "preempted"}
    assert gcp.instance() == ("t-2-node-x7q2", "us-central1-a")
    agent = Agent(_config(tmp_path, cloud="gcp"), FakeGpus(50), gcp, None, lambda r: None, now=lambda: NOW)
    assert agent.step() == "interrupted"


def test_imds_requires_the_v2_token(metadata):
    # without the token the server answers 401: the client always fetches one first
    assert AwsMetadata(metadata.url).instance_id() == "i-0abc"


def test_config_from_node_env_and_main_once(tmp_path, monkeypatch):
    env = tmp_path / "node.env"
    env.write_text(
        "GPUINFRA_CLOUD=aws\nGPUINFRA_STACK=t\nGPUINFRA_BUCKET=b\nGPUINFRA_EXPIRES_AT=2026-11-25T01:00:00Z\n"
        "GPUINFRA_IDLE_TIMEOUT_MINUTES=45\nGPUINFRA_IDLE_GPU_UTILIZATION_PERCENT=5\nGPUINFRA_SCRATCH=/scratch\n"
    )
    config = AgentConfig.from_env_file(env)
    assert config.idle_timeout_seconds == 2700 and config.checkpoint_dir == Path("/scratch/checkpoints")
    assert config.expires_at == datetime(2026, 11, 25, 1, 0, tzinfo=UTC)
    env.write_text("GPUINFRA_CLOUD=aws\n")
    with pytest.raises(ValueError, match="missing GPUINFRA_STACK"):
        AgentConfig.from_env_file(env)


def test_user_data_embeds_this_agent_verbatim():
    import yaml

    from gpuinfra.plan.aws import plan_aws_cluster
    from gpuinfra.plan.boot_aws import render_user_data
    from tests.blueprints.helpers import make_spec

    spec = make_spec("p4d.24xlarge", nodes=2)
    text = render_user_data(spec, plan_aws_cluster(spec), "b")
    files = {f["path"]: f for f in yaml.safe_load(text)["write_files"]}
    source = files["/usr/local/lib/gpuinfra/gpuinfra_agent.py"]["content"]
    original = (Path(__file__).resolve().parents[2] / "gpuinfra/agent/node.py").read_text()
    # the same program as gpuinfra/agent/node.py, less its docstrings and comments (user data is
    # limited to 16 KB): equal syntax trees once the original's docstrings are dropped
    tree = ast.parse(original)
    docstrings = 0
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            node.body = body[1:] or [ast.Pass()]
            docstrings += 1
    assert docstrings > 10
    assert ast.dump(ast.parse(source)) == ast.dump(tree)
    assert '"""' not in source and not any(line.lstrip().startswith("#") for line in source.splitlines())
    assert len(source) < 0.8 * len(original)
    compile(source, "gpuinfra_agent.py", "exec")
    unit = files["/etc/systemd/system/gpuinfra-agent.service"]["content"]
    assert (
        "ExecStart=/usr/bin/python3 /usr/local/lib/gpuinfra/gpuinfra_agent.py --config /etc/gpuinfra/node.env" in unit
    )
    assert ["systemctl", "enable", "--now", "--no-block", "gpuinfra-agent.service"] in yaml.safe_load(text)["runcmd"]


def test_gcp_startup_script_installs_and_enables_the_agent():
    from gpuinfra.plan.boot_gcp import render_startup_script
    from gpuinfra.plan.gcp import plan_gcp_cluster
    from tests.blueprints.helpers import gcp_script_files, make_spec

    spec = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp")
    script = render_startup_script(spec, plan_gcp_cluster(spec), "b")
    source = gcp_script_files(script)["/usr/local/lib/gpuinfra/gpuinfra_agent.py"][1]
    compile(source, "gpuinfra_agent.py", "exec")
    assert "systemctl enable --now --no-block gpuinfra-agent.service" in script


def test_real_nvml_on_a_gpu_machine():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception:
        pytest.skip("no NVIDIA driver / GPU on this machine")
    utilizations = NvmlGpus().utilizations()
    assert utilizations and all(0 <= u <= 100 for u in utilizations)


def _failing(tmp_path, calls=None):
    cli = FakeCli()
    cli.fail = lambda argv: calls.append(argv) is None if calls is not None else True
    return _sync(tmp_path, cli)


def test_a_failed_checkpoint_upload_never_keeps_the_node_running(tmp_path, metadata):
    _complete(tmp_path, "final")
    clock, ended = Clock(), []
    agent = Agent(
        _config(tmp_path),
        FakeGpus(0),
        AwsMetadata(metadata.url),
        _failing(tmp_path),
        ended.append,
        clock=clock,
        now=lambda: NOW,
    )
    agent.step()
    clock.t += 1800
    assert agent.step() == "idle" and ended == ["idle"]
    assert any("some complete checkpoints not in the bucket" in e for e in agent.events)


def test_unreachable_metadata_is_logged_and_the_poll_goes_on(tmp_path):
    ended = []
    # nothing listens on this port: every metadata call fails
    agent = Agent(
        _config(tmp_path, expires_at=NOW - timedelta(minutes=1)),
        FakeGpus(90),
        AwsMetadata("http://127.0.0.1:9"),
        None,
        ended.append,
        now=lambda: NOW,
    )
    assert agent.step() == "expired" and ended == ["expired"]  # node.env's TTL still ends it
    assert any("cannot read the interruption notice" in e for e in agent.events)


def test_the_idle_start_survives_an_agent_restart(tmp_path, metadata):
    state, clock, wall, ended = tmp_path / "run", Clock(), [NOW], []

    def make():
        return Agent(
            _config(tmp_path),
            FakeGpus(0),
            AwsMetadata(metadata.url),
            None,
            ended.append,
            clock=clock,
            now=lambda: wall[0],
            state_dir=state,
        )

    first = make()
    assert first.step() == "running" and (state / "idle_since").is_file()
    clock.t += 1000
    wall[0] = NOW + timedelta(seconds=1000)
    second = make()  # systemd restarted the agent after 1000 s of idle GPUs
    assert second.step() == "running"
    clock.t += 800
    wall[0] = NOW + timedelta(seconds=1800)
    assert second.step() == "idle" and ended == ["idle"]  # 30 min after the first idle poll, not 46


class BlackHole:
    """A TCP endpoint on 127.0.0.1 that accepts connections and never answers (an S3 endpoint
    behind a broken network path): every upload hangs until the client's read timeout."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self):
        self.sock.close()


def _checkpoints(tmp_path):
    root = tmp_path / "ckpt"
    (root / "step-100").mkdir(parents=True)
    (root / "step-100" / "model.pt").write_bytes(b"w" * 1024)
    return root


@pytest.mark.parametrize("imds_status", [403, 500])
@pytest.mark.parametrize("cli_failure", ["no-such-bucket", "hangs"])
def test_ttl_ends_the_node_within_the_sync_bound_while_imds_and_the_bucket_fail(
    tmp_path, metadata, imds_status, cli_failure
):
    _complete(tmp_path)
    metadata.fail_status = imds_status
    cli = FakeCli()
    if cli_failure == "hangs":
        cli.seconds_per_call = 1e6  # killed at its timeout, as subprocess.run does
    else:
        cli.fail = lambda argv: True
    ended = []
    bound = 1.5
    agent = Agent(
        _config(tmp_path, expires_at=NOW - timedelta(minutes=1)),
        FakeGpus(90),
        AwsMetadata(metadata.url),
        _sync(tmp_path, cli),
        ended.append,
        now=lambda: NOW,
        end_sync_seconds=bound,
    )
    started = time.monotonic()
    state = agent.step()
    elapsed = time.monotonic() - started
    assert state == "expired" and ended == ["expired"]  # TTL from node.env: IMDS answers only errors
    assert elapsed < bound + 1.0
    assert any("cannot read the interruption notice" in e for e in agent.events)
    assert any(
        "synced 0 checkpoint folder(s) to b, some complete checkpoints not in the bucket" in e for e in agent.events
    )


def test_gcp_preemption_is_seen_while_the_metadata_read_waits_for_a_change(metadata):
    gcp = GcpMetadata(metadata.url + "/computeMetadata/v1", wait_seconds=10)
    assert gcp.interruption() is None  # first read: the value now, and its ETag
    threading.Timer(0.3, metadata.preempt).start()
    started = time.monotonic()
    assert gcp.interruption() == {"action": "preempted"}  # the hanging read answers on the change
    assert 0.2 < time.monotonic() - started < 5


def test_gcp_metadata_wait_times_out_when_nothing_changes(metadata):
    gcp = GcpMetadata(metadata.url + "/computeMetadata/v1", wait_seconds=1)
    assert gcp.interruption() is None
    started = time.monotonic()
    assert gcp.interruption() is None
    assert 0.9 < time.monotonic() - started < 3


def test_each_node_syncs_under_its_own_prefix(tmp_path, metadata):
    cli = FakeCli()
    _complete(tmp_path)
    config = _config(tmp_path, stack="t2")
    aws_node = node_name(AwsMetadata(metadata.url))
    gcp_node = node_name(GcpMetadata(metadata.url + "/computeMetadata/v1"))
    assert (aws_node, gcp_node) == ("i-0abc", "t-2-node-x7q2")
    for node in (aws_node, "i-0def"):
        agent = Agent(
            config,
            FakeGpus(0),
            AwsMetadata(metadata.url),
            _sync(tmp_path, cli, node, "t2"),
            lambda r: None,
            now=lambda: NOW,
        )
        assert agent.save_checkpoints(10) == ["step-100"]
    assert {k.split("/")[3] for k in cli.keys("b/checkpoints/t2/")} == {"node-i-0abc", "node-i-0def"}


def test_node_name_falls_back_to_the_host_name_without_metadata():
    assert node_name(AwsMetadata("http://127.0.0.1:9")) == socket.gethostname()


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_both_boot_templates_write_a_node_env_the_agent_parses(tmp_path, cloud):
    import yaml

    from gpuinfra.plan.aws import plan_aws_cluster
    from gpuinfra.plan.boot_aws import render_user_data
    from gpuinfra.plan.boot_gcp import render_startup_script
    from gpuinfra.plan.gcp import plan_gcp_cluster
    from tests.blueprints.helpers import gcp_script_files, make_spec

    if cloud == "aws":
        spec = make_spec("p4d.24xlarge", nodes=2)
        files = {
            f["path"]: f["content"]
            for f in yaml.safe_load(render_user_data(spec, plan_aws_cluster(spec), "bkt"))["write_files"]
        }
        text = files["/etc/gpuinfra/node.env"]
    else:
        spec = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp")
        script = render_startup_script(spec, plan_gcp_cluster(spec), "bkt")
        text = gcp_script_files(script)["/etc/gpuinfra/node.env"][1]
    env = tmp_path / "node.env"
    env.write_text(text)
    config = AgentConfig.from_env_file(env)
    assert (config.cloud, config.stack, config.bucket) == (cloud, spec.stack, "bkt")
    assert config.expires_at == spec.expires_at.replace(microsecond=0)
    assert config.idle_timeout_seconds == spec.profile.idle_timeout_minutes * 60
    assert config.idle_utilization_percent == spec.profile.idle_gpu_utilization_percent
    assert config.checkpoint_dir == Path("/scratch/checkpoints")


def test_node_env_keys_are_checked_when_written():
    from gpuinfra.agent.node import format_node_env

    with pytest.raises(ValueError, match=r"unknown keys \['GPUINFRA_TYPO'\], missing keys \['GPUINFRA_CLOUD'"):
        format_node_env({"GPUINFRA_TYPO": "1"})


def test_a_failed_end_is_retried_without_syncing_again(tmp_path, metadata):
    _complete(tmp_path, "final")
    attempts, syncs, clock = [], [], Clock()

    def end_node(reason):
        attempts.append(reason)
        if len(attempts) == 1:
            raise RuntimeError("gcloud: metadata server unreachable")

    agent = Agent(
        _config(tmp_path, expires_at=NOW - timedelta(minutes=1)),
        FakeGpus(90),
        AwsMetadata(metadata.url),
        _failing(tmp_path, syncs),
        end_node,
        clock=clock,
        now=lambda: NOW,
    )
    assert agent.step() == "expired" and attempts == ["expired"]  # failed: tried again 5 s later
    assert any("end call failed, again in 5 s: RuntimeError('gcloud" in e for e in agent.events)
    clock.t += 5
    assert agent.step() == "expired" and attempts == ["expired", "expired"] and len(syncs) == 1


def test_idle_counts_only_once_the_health_gate_has_a_verdict(tmp_path):
    """While the gate waits for the image build, the peers and the all-reduce, idle GPUs are not
    idleness (a 30-min idle timeout would end nodes before any job could
    start); the TTL still applies."""
    clock, ended = Clock(), []
    state = tmp_path / "run"
    state.mkdir()
    agent = Agent(
        _config(tmp_path, health_gate="enforce", idle_timeout_seconds=60),
        FakeGpus(0),
        _NoMetadata(),
        None,
        ended.append,
        clock=clock,
        now=lambda: NOW,
        state_dir=state,
    )
    assert agent.step() == "starting"
    clock.t += 3600
    assert agent.step() == "starting" and not ended
    (state / "health-passed").write_text("2026-11-22T12:00:00+00:00\n")
    assert agent.step() == "running"  # the idle clock starts now
    clock.t += 61
    assert agent.step() == "idle" and len(ended) == 1
    # an excluded node waits for the ranks (ending it earlier would leave the peers short)
    excluded = Agent(
        _config(tmp_path, health_gate="enforce", idle_timeout_seconds=60),
        FakeGpus(0),
        _NoMetadata(),
        None,
        ended.append,
        clock=clock,
        now=lambda: NOW,
        state_dir=tmp_path / "excluded",
    )
    (tmp_path / "excluded" / "health-excluded").write_text("ecc: ...\n")
    assert excluded.step() == "starting"
    # gate off: idle from the first poll
    off = Agent(
        _config(tmp_path, health_gate="off", idle_timeout_seconds=60),
        FakeGpus(0),
        _NoMetadata(),
        None,
        ended.append,
        clock=clock,
        now=lambda: NOW,
        state_dir=tmp_path / "other",
    )
    assert off.step() == "running"


class _NoMetadata:
    """No spot notice, no TTL tag."""

    def interruption(self):
        return None

    def expires_at(self):
        return None


class Gcloud:
    """``subprocess.run`` stand-in recording gcloud argv; ``fail`` makes every call exit 1."""

    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def __call__(self, argv, check=False, timeout=None, **_):
        self.calls.append((list(argv), timeout))
        if self.fail and check:
            raise subprocess.CalledProcessError(1, argv, "", "ERROR: (gcloud) HTTPError 503")
        return subprocess.CompletedProcess(argv, 0, "", "")


@pytest.mark.parametrize(
    ("created_by", "argv"),
    [
        # a MIG member: deleted from its group, which shrinks instead of recreating it
        (
            200,
            [
                "gcloud", "compute", "instance-groups", "managed", "delete-instances", "t-2-node",
                "--instances=t-2-node-x7q2", "--zone=us-central1-a", "--quiet",
            ],
        ),
        # a VM of the bulk insert (no created-by key): it deletes itself
        (404, ["gcloud", "compute", "instances", "delete", "t-2-node-x7q2", "--zone=us-central1-a", "--quiet"]),
    ],
)  # fmt: skip
def test_a_gcp_node_ends_through_its_group_or_deletes_itself(metadata, monkeypatch, created_by, argv):
    gcloud = Gcloud()
    monkeypatch.setattr("gpuinfra.agent.node.subprocess.run", gcloud)
    metadata.created_by = created_by
    end_gcp_node("idle", GcpMetadata(metadata.url + "/computeMetadata/v1"))
    assert [c for c, _ in gcloud.calls] == [argv]


def test_no_answer_on_created_by_is_a_failed_end_call_not_a_guess(metadata, monkeypatch):
    """HTTP 500 on ``created-by``: neither end call is made; the agent's end retries cover it."""
    gcloud = Gcloud()
    monkeypatch.setattr("gpuinfra.agent.node.subprocess.run", gcloud)
    metadata.created_by = 500
    with pytest.raises(OSError, match="created-by: HTTP 500"):
        end_gcp_node("idle", GcpMetadata(metadata.url + "/computeMetadata/v1"))
    assert gcloud.calls == []


def test_a_preempted_bulk_vm_asks_its_group_for_a_replacement(metadata, monkeypatch):
    gcloud = Gcloud()
    monkeypatch.setattr("gpuinfra.agent.replace.subprocess.run", gcloud)
    gcp = GcpMetadata(metadata.url + "/computeMetadata/v1")
    assert request_gcp_replacement(gcp) == "" and gcloud.calls == []  # not preempted
    metadata.preempted = True
    names = set()
    for _ in range(200):
        name = request_gcp_replacement(gcp)
        names.add(name)
        argv, timeout = gcloud.calls[-1]
        assert argv == [
            "gcloud", "compute", "instance-groups", "managed", "create-instance", "t-2-node",
            f"--instance={name}", "--zone=us-central1-a",
        ]  # fmt: skip
        # the notice gives 30 s (cloud.google.com/compute/docs/instances/spot#preemption-process)
        assert timeout is not None and timeout < 30
        # <group>- + 4 of a-z0-9 like a MIG's own names, never a bulk name's n + 3 digits
        suffix = name.rsplit("-", 1)[1]
        assert (
            name.startswith("t-2-node-")
            and len(suffix) == 4
            and suffix.isalnum()
            and suffix.islower() | suffix.isdigit()
        )
        assert not (suffix[0] == "n" and suffix[1:].isdigit())
    assert len(names) > 190  # random, not one fixed name
    gcloud.calls.clear()
    # the stack's last hour: a replacement could not boot, restore and train before the TTL end
    assert request_gcp_replacement(gcp, NOW + timedelta(minutes=59), NOW) == "" and gcloud.calls == []
    assert request_gcp_replacement(gcp, NOW + timedelta(minutes=61), NOW) and len(gcloud.calls) == 1
    gcloud.calls.clear()
    metadata.created_by = 200  # a MIG member: the group's repair recreates it
    assert request_gcp_replacement(gcp) == "" and gcloud.calls == []


def test_the_replacement_is_asked_once_beside_the_notice_sync_and_a_failure_is_logged(tmp_path, metadata):
    """On the preemption notice the request runs in a thread while the checkpoints sync; a second
    trigger (SIGTERM of the ACPI soft-off) asks no second time; a failed request is logged."""
    started, release = threading.Event(), threading.Event()

    def replace():
        started.set()
        release.wait(5)
        raise subprocess.CalledProcessError(1, ["gcloud"])

    class Sync:  # the notice's checkpoint sync: records whether the request had started meanwhile
        seen: list = []

        def clock(self):
            return time.monotonic()

        def sync(self, deadline):
            self.seen.append(started.wait(5))

    gcp = GcpMetadata(metadata.url + "/computeMetadata/v1")
    metadata.preempted = True
    agent = Agent(_config(tmp_path, cloud="gcp"), FakeGpus(50), gcp, Sync, None, replace=replace, now=lambda: NOW)
    assert agent.step() == "interrupted"
    assert Sync.seen == [True]  # asked while the notice's sync ran, not after it
    agent.ask_replacement()  # the SIGTERM path
    release.set()
    for _ in range(50):
        if any("replacement request failed" in e for e in agent.events):
            break
        time.sleep(0.1)
    assert sum("replacement request failed: CalledProcessError" in e for e in agent.events) == 1


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_only_gcp_agents_ask_for_a_replacement(tmp_path, cloud):
    """AWS replaces a Spot node from an EventBridge rule (docs/preemption.md): its agent asks nothing."""
    from gpuinfra.agent.node import build_agent

    agent = build_agent(_config(tmp_path, cloud=cloud))
    assert (agent.replace is None) == (cloud == "aws")
