"""The node agent against a local metadata server, moto S3 on 127.0.0.1 and a fake NVML."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest

from gpuinfra.agent.node import (
    Agent,
    AgentConfig,
    AwsMetadata,
    GcpMetadata,
    NvmlGpus,
    S3Sync,
    sync_folder,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


class MetadataServer:
    """IMDSv2 (token required) and GCE metadata (Metadata-Flavor required) on 127.0.0.1."""

    def __init__(self):
        self.spot_action = None
        self.preempted = False
        self.expires_tag = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code, body=""):
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):  # noqa: N802
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, "token-123")
                return self._send(400)

            def do_GET(self):  # noqa: N802
                if self.path.startswith("/latest/"):
                    if self.headers.get("X-aws-ec2-metadata-token") != "token-123":
                        return self._send(401)
                    if self.path == "/latest/meta-data/spot/instance-action":
                        return self._send(200, json.dumps(server.spot_action)) if server.spot_action else self._send(404)
                    if self.path == "/latest/meta-data/tags/instance/gpuinfra:expires-at":
                        return self._send(200, server.expires_tag) if server.expires_tag else self._send(404)
                    if self.path == "/latest/meta-data/instance-id":
                        return self._send(200, "i-0abc")
                    return self._send(404)
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._send(403)
                if self.path == "/computeMetadata/v1/instance/preempted":
                    return self._send(200, "TRUE" if server.preempted else "FALSE")
                if self.path == "/computeMetadata/v1/instance/name":
                    return self._send(200, "t-2-node-x7q2")
                if self.path == "/computeMetadata/v1/instance/zone":
                    return self._send(200, "projects/123/zones/us-central1-a")
                return self._send(404)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metadata():
    server = MetadataServer()
    yield server
    server.close()


@pytest.fixture
def s3(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)
    name = f"ckpt-{datetime.now().timestamp():.0f}-{id(client)}"
    client.create_bucket(Bucket=name)
    return client, name


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
    values = dict(cloud="aws", stack="t", bucket="b", expires_at=NOW + timedelta(hours=5), idle_timeout_seconds=1800,
                  idle_utilization_percent=5, checkpoint_dir=tmp_path / "ckpt", dry_run=False)
    values.update(kw)
    return AgentConfig(**values)


def _listing(client, bucket, prefix):
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for p in pages for o in p.get("Contents", []))


def test_checkpoint_sync_loses_no_file_written_during_the_sync(tmp_path, s3):
    client, bucket = s3
    root = tmp_path / "ckpt"
    (root / "step-100").mkdir(parents=True)
    for i in range(3):
        (root / "step-100" / f"shard-{i}.pt").write_bytes(b"x" * (1000 + i))
    syncer = S3Sync(bucket, "checkpoints/t", client)
    late = root / "step-200" / "shard-0.pt"

    def write_during_sync(path):
        if not late.exists():
            late.parent.mkdir()
            late.write_bytes(b"late")

    uploaded = sync_folder(root, syncer, deadline=float("inf"), on_upload=write_during_sync)
    local = sorted(f"checkpoints/t/{p.relative_to(root).as_posix()}" for p in root.rglob("*") if p.is_file())
    assert _listing(client, bucket, "checkpoints/t/") == local == sorted(uploaded)
    assert "checkpoints/t/step-200/shard-0.pt" in local
    assert sync_folder(root, syncer, deadline=float("inf")) == []  # nothing new: nothing uploaded


def test_aws_spot_notice_syncs_checkpoints_and_does_not_end_the_node(tmp_path, s3, metadata):
    client, bucket = s3
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest.pt").write_bytes(b"weights")
    ended = []
    agent = Agent(_config(tmp_path, bucket=bucket), FakeGpus(90), AwsMetadata(metadata.url),
                  S3Sync(bucket, "checkpoints/t", client), ended.append, now=lambda: NOW)
    assert agent.step() == "running"
    metadata.spot_action = {"action": "terminate", "time": "2026-11-22T12:02:00Z"}
    assert agent.step() == "interrupted"
    assert _listing(client, bucket, "checkpoints/") == ["checkpoints/t/latest.pt"]
    assert ended == []  # EC2 reclaims the instance itself


def test_idle_for_the_timeout_syncs_then_ends_the_node(tmp_path, s3, metadata):
    client, bucket = s3
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "final.pt").write_bytes(b"w")
    clock, ended = Clock(), []
    agent = Agent(_config(tmp_path, bucket=bucket), FakeGpus(2, 0, 1, 3), AwsMetadata(metadata.url),
                  S3Sync(bucket, "checkpoints/t", client), ended.append, clock=clock, now=lambda: NOW)
    assert agent.step() == "running"          # idle starts now
    clock.t += 1799
    assert agent.step() == "running" and ended == []
    clock.t += 1
    assert agent.step() == "idle"
    assert ended == ["idle"] and _listing(client, bucket, "checkpoints/") == ["checkpoints/t/final.pt"]
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
    metadata.expires_tag = "2026-11-22T11:59:00Z"   # tag says expired; node.env says 5 h left
    agent = Agent(_config(tmp_path), FakeGpus(100), AwsMetadata(metadata.url), None, ended.append, now=lambda: NOW)
    assert agent.step() == "expired" and ended == ["expired"]


def test_dry_run_only_logs(tmp_path, metadata):
    ended = []
    agent = Agent(_config(tmp_path, expires_at=NOW - timedelta(minutes=1), dry_run=True), FakeGpus(0),
                  AwsMetadata(metadata.url), None, ended.append, now=lambda: NOW)
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
    env.write_text("GPUINFRA_CLOUD=aws\nGPUINFRA_STACK=t\nGPUINFRA_BUCKET=b\nGPUINFRA_EXPIRES_AT=2026-11-25T01:00:00Z\n"
                   "GPUINFRA_IDLE_TIMEOUT_MINUTES=45\nGPUINFRA_IDLE_GPU_UTILIZATION_PERCENT=5\nGPUINFRA_SCRATCH=/scratch\n")
    config = AgentConfig.from_env_file(env)
    assert config.idle_timeout_seconds == 2700 and config.checkpoint_dir == Path("/scratch/checkpoints")
    assert config.expires_at == datetime(2026, 11, 25, 1, 0, tzinfo=timezone.utc)
    env.write_text("GPUINFRA_CLOUD=aws\n")
    with pytest.raises(ValueError, match="missing GPUINFRA_STACK"):
        AgentConfig.from_env_file(env)


def test_user_data_embeds_this_agent_verbatim():
    from blueprints.aws.plan import plan_aws_cluster
    from blueprints.aws.userdata import render_user_data
    from tests.blueprints.helpers import make_spec
    import yaml

    spec = make_spec("p4d.24xlarge", nodes=2)
    text = render_user_data(spec, plan_aws_cluster(spec), "b")
    files = {f["path"]: f for f in yaml.safe_load(text)["write_files"]}
    source = files["/usr/local/lib/gpuinfra/gpuinfra_agent.py"]["content"]
    assert source.rstrip("\n") == (Path(__file__).resolve().parents[2] / "gpuinfra/agent/node.py").read_text().rstrip("\n")
    compile(source, "gpuinfra_agent.py", "exec")
    unit = files["/etc/systemd/system/gpuinfra-agent.service"]["content"]
    assert "ExecStart=/usr/bin/python3 /usr/local/lib/gpuinfra/gpuinfra_agent.py --config /etc/gpuinfra/node.env" in unit
    assert ["systemctl", "enable", "--now", "--no-block", "gpuinfra-agent.service"] in yaml.safe_load(text)["runcmd"]


def test_gcp_startup_script_installs_and_enables_the_agent():
    from blueprints.gcp.plan import plan_gcp_cluster
    from blueprints.gcp.startup import render_startup_script
    from tests.blueprints.helpers import make_spec

    spec = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp")
    script = render_startup_script(spec, plan_gcp_cluster(spec), "b")
    source = script.split("<<'GPUINFRA_AGENT'\n", 1)[1].split("\nGPUINFRA_AGENT\n", 1)[0]
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


class FailingSync(S3Sync):
    def __init__(self):
        super().__init__("b", "checkpoints/t", client=object())

    def upload(self, root, path):
        raise OSError("network unreachable")


def test_a_failed_checkpoint_upload_never_keeps_the_node_running(tmp_path, metadata):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "final.pt").write_bytes(b"w")
    clock, ended = Clock(), []
    agent = Agent(_config(tmp_path), FakeGpus(0), AwsMetadata(metadata.url), FailingSync(), ended.append,
                  clock=clock, now=lambda: NOW)
    agent.step()
    clock.t += 1800
    assert agent.step() == "idle" and ended == ["idle"]
    assert any("checkpoint sync failed, going on" in e for e in agent.events)


def test_unreachable_metadata_is_logged_and_the_poll_goes_on(tmp_path):
    ended = []
    # nothing listens on this port: every metadata call fails
    agent = Agent(_config(tmp_path, expires_at=NOW - timedelta(minutes=1)), FakeGpus(90),
                  AwsMetadata("http://127.0.0.1:9"), None, ended.append, now=lambda: NOW)
    assert agent.step() == "expired" and ended == ["expired"]  # node.env's TTL still ends it
    assert any("cannot read the interruption notice" in e for e in agent.events)


def test_the_idle_start_survives_an_agent_restart(tmp_path, metadata):
    state, clock, wall, ended = tmp_path / "run", Clock(), [NOW], []

    def make():
        return Agent(_config(tmp_path), FakeGpus(0), AwsMetadata(metadata.url), None, ended.append,
                     clock=clock, now=lambda: wall[0], state_dir=state)

    first = make()
    assert first.step() == "running" and (state / "idle_since").is_file()
    clock.t += 1000
    wall[0] = NOW + timedelta(seconds=1000)
    second = make()  # systemd restarted the agent after 1000 s of idle GPUs
    assert second.step() == "running"
    clock.t += 800
    wall[0] = NOW + timedelta(seconds=1800)
    assert second.step() == "idle" and ended == ["idle"]  # 30 min after the first idle poll, not 46


def test_main_survives_a_failing_poll(tmp_path, monkeypatch, metadata):
    from gpuinfra.agent import node

    calls = []

    class Flaky:
        def step(self):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("boom")
            return "expired"

    monkeypatch.setattr(node, "build_agent", lambda config, state_dir: Flaky())
    monkeypatch.setattr(node.time, "sleep", lambda s: None)
    env = tmp_path / "node.env"
    env.write_text("GPUINFRA_CLOUD=aws\nGPUINFRA_STACK=t\nGPUINFRA_BUCKET=b\nGPUINFRA_IDLE_TIMEOUT_MINUTES=30\n"
                   "GPUINFRA_IDLE_GPU_UTILIZATION_PERCENT=5\n")
    assert node.main(["--config", str(env), "--state-dir", str(tmp_path / "run")]) == 0 and len(calls) == 2
