"""The box's own parts without booting anything (no root needed): the scenario's text overrides,
the stand-in cloud's answers, the rootfs cache key."""

from __future__ import annotations

import json

import pytest

from gpuinfra.health import parsers
from tests.box import rootfs, server
from tests.box.render import render_boot, stack_spec
from tests.box.scenario import Scenario, aws_p5, fi_info_efa, gcp_a3mega


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A server state folder with two running nodes and the healthy p5 scenario."""
    monkeypatch.setattr(server, "STATE", tmp_path)
    (tmp_path / "nodes.json").write_text(
        json.dumps(
            {
                "nodes": [
                    {"name": "i-1", "id": "i-1", "ip": "10.77.0.12", "state": "running"},
                    {"name": "i-0", "id": "i-0", "ip": "10.77.0.11", "state": "running"},
                    {"name": "i-2", "id": "i-2", "ip": "10.77.0.13", "state": "terminated"},
                ]
            }
        )
    )
    return tmp_path


def cli(argv: list[str], files: dict[str, bytes] | None = None, stdin: bytes = b"", scenario: Scenario | None = None):
    call = server.Cli(
        argv,
        files or {},
        stdin,
        {"name": "i-0", "ip": "10.77.0.11"},
        (scenario or aws_p5()).to_json("us-east-1", "us-east-1a"),
    )
    return (*call.answer(), call.writes, call.after)


def test_the_idle_override_changes_exactly_the_node_env_line():
    spec = stack_spec("example-p5-2nodes")
    text = render_boot(spec, "b").text
    patched = Scenario("example-p5-2nodes", aws_p5().gpus, node_env={"GPUINFRA_IDLE_TIMEOUT_MINUTES": "0.05"}).patch(
        text
    )
    changed = [(a.strip(), b.strip()) for a, b in zip(text.splitlines(), patched.splitlines(), strict=True) if a != b]
    assert changed == [("GPUINFRA_IDLE_TIMEOUT_MINUTES=60", "GPUINFRA_IDLE_TIMEOUT_MINUTES=0.05")]


def test_an_override_that_finds_nothing_is_an_error():
    with pytest.raises(ValueError, match="GPUINFRA_NO_SUCH_KEY found 0 times"):
        Scenario("s", aws_p5().gpus, node_env={"GPUINFRA_NO_SUCH_KEY": "1"}).patch("GPUINFRA_STACK=s\n")


def test_the_gcp_nic_wait_is_replaced_once():
    text = render_boot(stack_spec("example-a3mega-2nodes"), "b").text
    assert "NIC_DEADLINE=$(( $(date +%s) + 0 ))" in gcp_a3mega().patch(text)
    assert "+ 300 ))" not in gcp_a3mega().patch(text)


def test_the_box_renders_scratch_without_local_disks_and_leaves_the_renderer_as_it_was():
    from gpuinfra.plan import boot_aws as userdata

    before = userdata.scratch_script
    assert "EXPECTED_DISKS=0" in render_boot(stack_spec("example-p5-2nodes"), "b").text
    assert userdata.scratch_script is before


def test_fi_info_stand_in_lists_32_efa_devices():
    assert len(parsers.parse_fi_info(fi_info_efa(32)).devices) == 32


def test_describe_instances_lists_pending_and_running_nodes(state):
    assert cli(
        [
            "aws",
            "ec2",
            "describe-instances",
            "--region",
            "us-east-1",
            "--filters",
            "x",
            "--query",
            "q",
            "--output",
            "text",
        ]
    )[:3] == (0, "10.77.0.12\t10.77.0.11\n", "")


def test_s3_create_only_put_answers_precondition_failed_the_second_time(state):
    argv = [
        "aws",
        "s3api",
        "put-object",
        "--bucket",
        "b",
        "--key",
        "health/s/ranks.json",
        "--body",
        "/tmp/r",
        "--if-none-match",
        "*",
    ]
    assert cli(argv, {"/tmp/r": b"first"})[0] == 0
    rc, _, err, _, _ = cli(argv, {"/tmp/r": b"second"})
    assert rc == 254 and "(PreconditionFailed)" in err
    assert (state / "bucket" / "b" / "health" / "s" / "ranks.json").read_bytes() == b"first"


def test_s3_recursive_copy_writes_keys_under_the_prefix(state):
    for key in ("health/s/i-0.json", "health/s/i-1.json", "health/t/i-9.json"):
        assert (
            cli(["aws", "s3", "cp", "--only-show-errors", "/tmp/f", f"s3://b/{key}"], {"/tmp/f": key.encode()})[0] == 0
        )
    rc, _, _, writes, _ = cli(["aws", "s3", "cp", "--only-show-errors", "--recursive", "s3://b/health/s/", "/tmp/d"])
    assert rc == 0 and writes == {"/tmp/d/i-0.json": b"health/s/i-0.json", "/tmp/d/i-1.json": b"health/s/i-1.json"}


def test_an_object_still_being_written_is_neither_listed_nor_read(state):
    """A peer's upload in flight (the stand-in writes ``<key>.box-tmp``, then renames it under the
    lock) is not an object yet: a listing read at that moment neither shows it nor fails on it."""
    assert (
        cli(["aws", "s3", "cp", "--only-show-errors", "/tmp/f", "s3://b/health/s/i-0.json"], {"/tmp/f": b"0"})[0] == 0
    )
    partial = server._object_path("b", "health/s/i-1.json" + server.PARTIAL_SUFFIX)
    partial.write_bytes(b"half")
    rc, _, _, writes, _ = cli(["aws", "s3", "cp", "--only-show-errors", "--recursive", "s3://b/health/s/", "/tmp/d"])
    assert rc == 0 and writes == {"/tmp/d/i-0.json": b"0"}
    rc, _, _, writes, _ = cli(["aws", "s3", "sync", "s3://b/health/s/", "/tmp/e"])
    assert rc == 0 and writes == {"/tmp/e/i-0.json": b"0"}


def test_gcloud_storage_create_only_copy_ls_and_rm(state):
    scenario = gcp_a3mega()
    url = "gs://b/gpuinfra-peers/g/vm-0/10.77.0.11"
    assert cli(["gcloud", "storage", "cp", "-", url, "--quiet"], stdin=b"", scenario=scenario)[0] == 0
    rc, _, err, _, _ = cli(
        ["gcloud", "storage", "cp", "--if-generation-match=0", "/tmp/f", url], {"/tmp/f": b"x"}, scenario=scenario
    )
    assert rc == 1 and "HTTPError 412" in err
    assert cli(["gcloud", "storage", "ls", "gs://b/gpuinfra-peers/g/**"], scenario=scenario)[1] == url + "\n"
    assert cli(["gcloud", "storage", "rm", "gs://b/gpuinfra-peers/g/vm-0/**", "--quiet"], scenario=scenario)[0] == 0
    assert cli(["gcloud", "storage", "ls", "gs://b/gpuinfra-peers/g/**"], scenario=scenario)[0] == 1


def test_a_failing_call_pattern_fails_only_matching_calls(state):
    scenario = Scenario(
        "s", gcp_a3mega().gpus, failing_calls=("gcloud compute instance-groups managed delete-instances *",)
    )
    delete = [
        "gcloud",
        "compute",
        "instance-groups",
        "managed",
        "delete-instances",
        "g",
        "--instances=vm-0",
        "--zone=z",
        "--quiet",
    ]
    rc, _, err, _, after = cli(delete, scenario=scenario)
    assert (rc, after) == (1, []) and "scenario makes this call fail" in err
    assert cli(delete, scenario=gcp_a3mega())[::4] == (0, ["/usr/bin/systemctl", "poweroff", "--no-block"])


def test_shutdown_is_recorded_then_handed_to_the_real_one(state):
    assert cli(["shutdown", "-h", "now", "gpuinfra agent: idle"])[4] == [
        "/usr/sbin/shutdown",
        "-h",
        "now",
        "gpuinfra agent: idle",
    ]


def test_the_rootfs_key_changes_with_the_package_list(monkeypatch):
    key = rootfs.cache_key()
    monkeypatch.setattr(rootfs, "PACKAGES", (*rootfs.PACKAGES, "strace"))
    assert rootfs.cache_key() != key and len(key) == 16


@pytest.fixture
def metadata(state):
    """The stand-in cloud on 127.0.0.1 (an ephemeral port), 127.0.0.1 being node ``i-0``."""
    import threading
    from http.server import ThreadingHTTPServer

    doc = json.loads((state / "nodes.json").read_text())
    doc["nodes"][1]["ip"] = "127.0.0.1"
    (state / "nodes.json").write_text(json.dumps(doc))
    (state / "scenario.json").write_text(
        json.dumps(gcp_a3mega().to_json("us-east-1", "europe-west1-b", {"startup-script": "#!/bin/bash\necho hi\n"}))
    )
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), server.Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    httpd.shutdown()


def http(url: str, method: str = "GET", headers: dict | None = None) -> tuple[int, str, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never via a proxy
        with opener.open(request, timeout=5) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def test_imds_answers_only_with_the_session_token(metadata):
    base, _ = metadata
    assert http(f"{base}/latest/meta-data/local-ipv4")[0] == 401
    status, token, _ = http(f"{base}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    assert status == 200
    get = lambda path: http(f"{base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})[:2]  # noqa: E731
    assert [get(p) for p in ("instance-id", "local-ipv4", "placement/region", "placement/availability-zone")] == [
        (200, "i-0"),
        (200, "127.0.0.1"),
        (200, "us-east-1"),
        (200, "europe-west1-b"),
    ]
    assert get("spot/instance-action")[0] == 404


def test_a_spot_notice_appears_in_imds(metadata):
    base, state = metadata
    doc = json.loads((state / "nodes.json").read_text())
    doc["nodes"][1]["notices"] = {"spot": {"action": "terminate", "time": "2026-11-26T14:00:00Z"}}
    (state / "nodes.json").write_text(json.dumps(doc))
    token = http(f"{base}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "300"})[1]
    assert json.loads(
        http(f"{base}/latest/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": token})[1]
    ) == {"action": "terminate", "time": "2026-11-26T14:00:00Z"}


def test_gce_metadata_needs_the_flavor_header_and_echoes_it(metadata):
    base, _ = metadata
    url = f"{base}/computeMetadata/v1/instance/attributes/startup-script"
    assert http(url)[0] == 403
    status, body, headers = http(url, headers={"Metadata-Flavor": "Google"})
    assert (status, body, headers["Metadata-Flavor"]) == (200, "#!/bin/bash\necho hi\n", "Google")
    flavor = {"Metadata-Flavor": "Google"}
    assert (
        http(f"{base}/computeMetadata/v1/instance/zone", headers=flavor)[1]
        == "projects/1234567890/zones/europe-west1-b"
    )
    assert http(f"{base}/computeMetadata/v1/instance/preempted", headers=flavor)[1] == "FALSE"


def test_the_group_lists_its_members_and_describe_finds_every_running_vm(state):
    """Bulk VMs (``mig: false``) are not listed by the group but found by name; a terminated VM
    answers gcloud's 404 ("was not found")."""
    doc = json.loads((state / "nodes.json").read_text())
    doc["nodes"][0]["mig"] = False  # i-1: a VM of the bulk insert
    (state / "nodes.json").write_text(json.dumps(doc))
    scenario = gcp_a3mega()
    listed = cli(
        ["gcloud", "compute", "instance-groups", "managed", "list-instances", "g", "--zone", "z"], scenario=scenario
    )
    assert listed[:2] == (0, "i-0\n")
    describe = ["gcloud", "compute", "instances", "describe", "{}", "--zone", "z", "--format=value(status)"]
    assert cli([a.format("i-1") for a in describe], scenario=scenario)[:2] == (0, "RUNNING\n")
    rc, _, err, _, _ = cli([a.format("i-2") for a in describe], scenario=scenario)
    assert rc == 1 and "was not found" in err
    # a node deletes itself: a power-off; create-instance is recorded only
    delete = ["gcloud", "compute", "instances", "delete", "i-0", "--zone=z", "--quiet"]
    assert cli(delete, scenario=scenario)[::4] == (0, ["/usr/bin/systemctl", "poweroff", "--no-block"])
    create = [
        "gcloud",
        "compute",
        "instance-groups",
        "managed",
        "create-instance",
        "g",
        "--instance=g-ab12",
        "--zone=z",
    ]
    assert cli(create, scenario=scenario)[::4] == (0, [])


def test_created_by_is_set_for_group_members_only(metadata):
    base, state = metadata
    flavor = {"Metadata-Flavor": "Google"}
    url = f"{base}/computeMetadata/v1/instance/attributes/created-by"
    assert http(url, headers=flavor)[:2] == (200, "projects/1234567890/zones/europe-west1-b/instanceGroupManagers/i")
    doc = json.loads((state / "nodes.json").read_text())
    doc["nodes"][1]["mig"] = False
    (state / "nodes.json").write_text(json.dumps(doc))
    assert http(url, headers=flavor)[0] == 404
