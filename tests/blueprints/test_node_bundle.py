"""The node bundle (gpuinfra/plan/node_bundle.py): what each family's nodes install from the
stack bucket, the object Pulumi creates before the nodes, the fetch script run for real, and the
EFA training image recipe."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from gpuinfra.plan.aws import plan_aws_cluster
from gpuinfra.plan.boot_aws import aws_node_bundle
from gpuinfra.plan.boot_gcp import gcp_node_bundle
from gpuinfra.plan.fabric import AWS_OFI_NCCL_VERSION, EFA_INSTALLER_VERSION, RUN_SCRIPT_PATH, efa_image_build
from gpuinfra.plan.fabric_host import HOST_SCRIPT_PATH
from gpuinfra.plan.gcp import plan_gcp_cluster
from gpuinfra.plan.health import expectations_for
from gpuinfra.plan.node_bundle import (
    ALLREDUCE_PATH,
    EXPECTATIONS_PATH,
    NODE_MODULES,
    NodeBundle,
    bundle_key,
    fetch_script,
)
from tests.blueprints.helpers import make_spec, need_tool, preview

REPO = Path(__file__).resolve().parents[2]
IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3@sha256:96990c82825613c3bdeebb66675c7c91b0123f64a5895623316dc5b824e0d7a9"  # the profiles' pinned default
MODULE_PATHS = sorted(f"/usr/local/lib/gpuinfra/gpuinfra/{m}" for m in NODE_MODULES)


def test_p5_bundle_builds_the_efa_image_and_runs_the_gate_after_it():
    spec = make_spec("p5.48xlarge", nodes=2, profile="llm-pretrain")
    bundle = aws_node_bundle(spec, plan_aws_cluster(spec))
    assert bundle.units == [
        "gpuinfra-image.service",
        "gpuinfra-monitoring.service",
        "gpuinfra-health.service",
        "gpuinfra-restore.service",
        "gpuinfra-job.service",
    ]
    assert sorted(f.path for f in bundle.files) == sorted(
        [
            "/etc/gpuinfra/image/Dockerfile",
            "/etc/systemd/system/gpuinfra-image.service",
            RUN_SCRIPT_PATH,
            "/etc/systemd/system/gpuinfra-monitoring.service",
            "/usr/local/sbin/gpuinfra-monitoring",
            *MODULE_PATHS,
            ALLREDUCE_PATH,
            EXPECTATIONS_PATH,
            "/etc/systemd/system/gpuinfra-health.service",
            "/etc/systemd/system/gpuinfra-restore.service",
            "/etc/systemd/system/gpuinfra-job.service",
        ]
    )
    assert bundle.file("/usr/local/sbin/gpuinfra-monitoring").mode == "0755"
    build = efa_image_build(IMAGE)
    image_unit = bundle.file("/etc/systemd/system/gpuinfra-image.service").content
    # built from the recipe, unless the base already has the EFA user space (a baked container):
    # tagged then; 3 tries inside one start (a Restart= would release the gate at the first failure)
    # the base image, the tag and the build folder reach the shell as arguments, never as script text
    start = next(line for line in image_unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(start.removeprefix("ExecStart=").replace("$$", "$"))
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == ["sh", IMAGE, build.tag, "/etc/gpuinfra/image"]
    assert argv[2].startswith(
        'for _ in 1 2 3; do if docker run --rm --entrypoint /bin/sh "$1" -c "ls '
        '/opt/amazon/efa/lib*/libfabric.so* /opt/amazon/ofi-nccl/lib/libnccl-net.so"'
    )
    assert 'then docker tag "$1" "$2" && exit 0; else docker build --tag "$2" "$3" && exit 0; fi' in argv[2]
    assert "Restart=" not in image_unit
    assert f"ExecCondition=/bin/sh -c '! docker image inspect \"$$1\" >/dev/null 2>&1' sh {build.tag}\n" in image_unit
    health_unit = bundle.file("/etc/systemd/system/gpuinfra-health.service").content
    assert (
        "After=network-online.target gpuinfra-bundle.service docker.service gpuinfra-scratch.service "
        "gpuinfra-image.service\n" in health_unit
    )
    assert "ExecStart=/usr/bin/python3 -m gpuinfra.health.node run\n" in health_unit
    assert "Environment=PYTHONPATH=/usr/local/lib/gpuinfra\n" in health_unit
    # gpuinfra-run runs the built image by default
    assert f"IMAGE={build.tag}\n" in bundle.file(RUN_SCRIPT_PATH).content
    expected = json.loads(bundle.file(EXPECTATIONS_PATH).content)
    # the stack's expectations, the stack file's time (older results are another deployment's) and
    # the baseline for a smaller world (none is cited for 1 x p5 over EFA: empty)
    assert expected == {
        **expectations_for(spec).to_dict(),
        "results_not_before": "2026-11-22T01:00:00+00:00",
        "world_baselines": {},
    }
    # the node's modules are the repository's, byte for byte
    for path in MODULE_PATHS:
        rel = path.removeprefix("/usr/local/lib/gpuinfra/")
        assert bundle.file(path).content == (REPO / rel).read_text()


def test_efa_image_recipe_pins_the_efa_user_space():
    build = efa_image_build(IMAGE)
    text = build.dockerfile
    # awsome-distributed-training@0162aacd micro-benchmarks/nccl-tests/nccl-tests.Dockerfile L7-8
    assert (EFA_INSTALLER_VERSION, AWS_OFI_NCCL_VERSION) == ("1.43.2", "1.16.3")
    assert text.splitlines()[9] == f"FROM {IMAGE}"
    assert "ARG EFA_INSTALLER_VERSION=1.43.2\nARG AWS_OFI_NCCL_VERSION=1.16.3\n" in text
    assert "./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify" in text
    assert "--with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda" in text and "--enable-platform-aws" in text
    assert "rm -rf /opt/hpcx/ompi /usr/local/mpi /opt/hpcx/nccl_rdma_sharp_plugin" in text
    assert "ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}" in text
    assert re.fullmatch(r"gpuinfra/train:efa-[0-9a-f]{12}", build.tag)
    assert efa_image_build("nvcr.io/nvidia/pytorch:25.02-py3").tag != build.tag
    with pytest.raises(ValueError, match="needs a base image"):
        efa_image_build("")


def test_every_run_step_of_the_efa_recipe_passes_shellcheck(tmp_path):
    text = efa_image_build(IMAGE).dockerfile.replace("\\\n", " ")
    steps = [line[len("RUN ") :] for line in text.splitlines() if line.startswith("RUN ")]
    assert len(steps) == 4
    for index, step in enumerate(steps):
        path = tmp_path / f"step{index}.sh"
        # docker runs RUN lines with /bin/sh -c; the ARG values are in the environment
        path.write_text(f"#!/bin/sh\nEFA_INSTALLER_VERSION=1\nAWS_OFI_NCCL_VERSION=1\n{step}\n")
        check = subprocess.run(
            [need_tool("shellcheck"), "--severity=style", "-e", "SC2034", str(path)], capture_output=True, text=True
        )
        assert check.returncode == 0, f"RUN {step}\n{check.stdout}"


def test_nodes_without_efa_or_image_build_nothing():
    spec = make_spec("g5.xlarge", profile="dev")
    bundle = aws_node_bundle(spec, plan_aws_cluster(spec))
    assert bundle.units == [
        "gpuinfra-monitoring.service",
        "gpuinfra-health.service",
        "gpuinfra-restore.service",
        "gpuinfra-job.service",
    ]
    assert f"IMAGE={IMAGE}\n" in bundle.file(RUN_SCRIPT_PATH).content
    off = spec.profile.model_copy(
        update={"health_gate": "off", "monitoring": spec.profile.monitoring.model_copy(update={"enabled": False})}
    )
    bundle = aws_node_bundle(spec.model_copy(update={"profile": off}), plan_aws_cluster(spec))
    # the checkpoint restore and the job unit run whatever the gate and monitoring settings
    assert bundle.units == ["gpuinfra-restore.service", "gpuinfra-job.service"] and ALLREDUCE_PATH in [
        f.path for f in bundle.files
    ]


@pytest.mark.parametrize(
    ("machine", "profile", "units"),
    [
        # A3 Mega: TCPXO host stack installed at boot, the gate after it
        (
            "a3-megagpu-8g",
            "llm-pretrain",
            [
                "gpuinfra-fabric-host.service",
                "gpuinfra-monitoring.service",
                "gpuinfra-health.service",
                "gpuinfra-restore.service",
                "gpuinfra-job.service",
            ],
        ),
        (
            "a3-ultragpu-8g",
            "llm-pretrain",
            [
                "gpuinfra-fabric-host.service",
                "gpuinfra-monitoring.service",
                "gpuinfra-health.service",
                "gpuinfra-restore.service",
                "gpuinfra-job.service",
            ],
        ),
        # A3 High without a baked image: plain networking, nothing to install
        (
            "a3-highgpu-8g",
            "llm-finetune",
            [
                "gpuinfra-monitoring.service",
                "gpuinfra-health.service",
                "gpuinfra-restore.service",
                "gpuinfra-job.service",
            ],
        ),
        (
            "a2-highgpu-8g",
            "llm-finetune",
            [
                "gpuinfra-monitoring.service",
                "gpuinfra-health.service",
                "gpuinfra-restore.service",
                "gpuinfra-job.service",
            ],
        ),
    ],
)
def test_gcp_bundles_install_the_fabric_host_stack_where_it_can_be(machine, profile, units):
    spec = make_spec(machine, nodes=2, profile=profile, cloud="gcp", spot=machine == "a3-ultragpu-8g")
    bundle = gcp_node_bundle(spec, plan_gcp_cluster(spec))
    assert bundle.units == units
    paths = [f.path for f in bundle.files]
    assert (HOST_SCRIPT_PATH in paths) == ("gpuinfra-fabric-host.service" in units)
    if "gpuinfra-fabric-host.service" in units:
        assert bundle.file(HOST_SCRIPT_PATH).mode == "0755"
        # after the host stack and after the boot's pre-pull of the image its all-reduce runs in
        assert (
            "After=network-online.target gpuinfra-bundle.service docker.service gpuinfra-scratch.service "
            "gpuinfra-fabric-host.service gpuinfra-prepull.service\n"
        ) in bundle.file("/etc/systemd/system/gpuinfra-health.service").content


def test_bundle_document_is_deterministic_and_refuses_bad_paths():
    bundle = NodeBundle()
    bundle.add("/b", "two")
    bundle.add("/a", "one\n", "0755")
    doc = json.loads(bundle.to_json())
    assert doc == {
        "schema_version": "1",
        "units": [],
        "files": [
            {"path": "/a", "mode": "0755", "content": "one\n"},
            {"path": "/b", "mode": "0644", "content": "two\n"},
        ],
    }
    with pytest.raises(ValueError, match="already has /a"):
        bundle.add("/a", "x")
    with pytest.raises(ValueError, match="'rel' is not absolute"):
        bundle.add("rel", "x")


def _pinned_sha256(boot_text: str) -> str:
    """The SHA-256 the fetch script in a node's boot text checks the bundle against."""
    (pinned,) = re.findall(r"^ *SHA256=([0-9a-f]{64})$", boot_text, re.M)
    return pinned


def test_preview_creates_the_bundle_object_before_the_nodes_and_pins_its_hash():
    """The object the nodes fetch is named after the SHA-256 of its bytes, and the boot text of
    the same preview pins that SHA-256 (hashed here, independently of the bundle code)."""
    spec = make_spec("p4d.24xlarge", nodes=2, profile="llm-pretrain")
    result = preview(spec)
    (obj,) = result.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
    content = obj.inputs["content"]
    assert content == aws_node_bundle(spec, plan_aws_cluster(spec)).to_json()
    digest = hashlib.sha256(content.encode()).hexdigest()
    assert obj.inputs["key"] == f"gpuinfra/node-bundle-{digest}.json"
    assert obj.inputs["contentType"] == "application/json"
    (template,) = result.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    user_data = gzip.decompress(base64.b64decode(template.inputs["userData"])).decode()
    assert _pinned_sha256(user_data) == digest and f"/{obj.inputs['key']}\n" in user_data
    gspec = make_spec("a3-megagpu-8g", nodes=2, profile="llm-pretrain", cloud="gcp")
    gresult = preview(gspec)
    (gobj,) = gresult.of_type("gcp:storage/bucketObject:BucketObject")
    gcontent = gobj.inputs["content"]  # the provider marks a GCS object's content secret
    assert isinstance(gcontent, dict) and gcontent["value"] == gcp_node_bundle(gspec, plan_gcp_cluster(gspec)).to_json()
    gdigest = hashlib.sha256(gcontent["value"].encode()).hexdigest()
    assert gobj.inputs["name"] == f"gpuinfra/node-bundle-{gdigest}.json"
    (gtemplate,) = gresult.of_type("gcp:compute/instanceTemplate:InstanceTemplate")
    assert _pinned_sha256(gtemplate.inputs["metadata"]["startup-script"]) == gdigest


def test_a_changed_bundle_is_a_new_key_and_a_new_boot_text():
    """Bundles that differ in one byte get different keys and different fetch scripts (so a
    changed bundle changes the boot text and `up` replaces the nodes instead of handing running
    nodes a bundle they did not boot with)."""
    a = NodeBundle()
    a.add("/a", "one")
    b = NodeBundle()
    b.add("/a", "two")
    assert a.key != b.key and fetch_script("aws", "bkt", a.sha256()) != fetch_script("aws", "bkt", b.sha256())
    with pytest.raises(ValueError, match="not a SHA-256"):
        bundle_key("ABC")


class FetchNode:
    """The fetch script run for real (bash) with stand-in aws / gcloud / curl / systemctl: the
    bucket's object is ``self.object``; /run/gpuinfra and /var/lib/gpuinfra live under ``tmp``."""

    def __init__(self, tmp_path: Path, cloud: str, bundle: NodeBundle) -> None:
        self.tmp, self.cloud, self.bundle = tmp_path, cloud, bundle
        self.object = tmp_path / "bucket-object.json"
        self.object.write_text(bundle.to_json())
        self.calls = tmp_path / "calls.log"
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        stubs = {
            # the CLIs copy the bucket's object to the destination (last argument), or fail when it is absent
            "aws": 'echo "aws $*" >> "$CALLS"; for a; do dest="$a"; done; cp "$OBJECT" "$dest"',
            "gcloud": 'echo "gcloud $*" >> "$CALLS"; for a; do dest="$a"; done; cp "$OBJECT" "$dest"',
            "curl": 'case "$*" in *api/token*) echo token ;; *placement/region*) echo us-east-1 ;; esac',
            "systemctl": 'echo "systemctl $*" >> "$CALLS"',
        }
        for name, body in stubs.items():
            (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
            (bin_dir / name).chmod(0o755)
        self.script = tmp_path / "fetch.sh"
        text = fetch_script(cloud, "bkt", bundle.sha256())
        text = text.replace("/run/gpuinfra", str(tmp_path / "run")).replace("/var/lib/gpuinfra", str(tmp_path / "var"))
        self.script.write_text(text)
        self.env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(self.calls), "OBJECT": str(self.object)}

    def boot(self) -> subprocess.CompletedProcess:
        """One run of the script (one boot); the calls log starts empty."""
        self.calls.write_text("")
        return subprocess.run(["bash", str(self.script)], env=self.env, capture_output=True, text=True, timeout=60)

    def fetched(self) -> list[str]:
        key = self.bundle.key
        dest = f"{self.tmp}/run/node-bundle.json.tmp"
        if self.cloud == "aws":
            return [f"aws s3 cp --only-show-errors --region us-east-1 s3://bkt/{key} {dest}"]
        return [f"gcloud storage cp gs://bkt/{key} {dest}"]


@pytest.fixture
def fetch_node(tmp_path):
    if os.name != "posix":
        pytest.skip("bash only")
    root = tmp_path / "root"
    bundle = NodeBundle()
    bundle.add(f"{root}/usr/local/bin/tool", "#!/bin/sh\necho hi", "0755")
    bundle.add(f"{root}/etc/gpuinfra/x.json", "{}")
    bundle.units += ["gpuinfra-health.service", "gpuinfra-image.service"]
    return lambda cloud: (FetchNode(tmp_path, cloud, bundle), root)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_fetch_script_installs_the_files_and_starts_the_units(fetch_node, cloud):
    node, root = fetch_node(cloud)
    result = node.boot()
    assert result.returncode == 0, result.stderr
    assert node.calls.read_text().splitlines() == [
        *node.fetched(),
        "systemctl daemon-reload",
        "systemctl enable --now --no-block gpuinfra-health.service",
        "systemctl enable --now --no-block gpuinfra-image.service",
    ]
    tool = root / "usr/local/bin/tool"
    assert tool.read_text() == "#!/bin/sh\necho hi\n" and oct(tool.stat().st_mode & 0o777) == "0o755"
    assert oct((root / "etc/gpuinfra/x.json").stat().st_mode & 0o777) == "0o644"
    assert (node.tmp / "var/node-bundle.json").read_text() == node.object.read_text()  # the verified copy
    check = subprocess.run(
        [need_tool("shellcheck"), "--severity=style", str(node.script)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_fetch_script_refuses_a_bundle_whose_hash_differs(fetch_node, cloud):
    """The object was rewritten in the bucket (same key): nothing of it is written or started,
    the script fails (systemd retries it), and the verdict names both hashes."""
    node, root = fetch_node(cloud)
    tampered = node.bundle.to_json().replace("echo hi", "echo pwned")
    node.object.write_text(tampered)
    result = node.boot()
    assert result.returncode == 1
    assert node.calls.read_text().splitlines() == node.fetched()  # no daemon-reload, no unit started
    assert not (root / "usr/local/bin/tool").exists() and not (root / "etc/gpuinfra/x.json").exists()
    assert not (node.tmp / "var/node-bundle.json").exists() and not (node.tmp / "run/node-bundle.json").exists()
    got = hashlib.sha256(tampered.encode()).hexdigest()
    want = hashlib.sha256(node.bundle.to_json().encode()).hexdigest()
    verdict = (node.tmp / "run/health-failed").read_text()
    assert verdict == (
        f"node bundle refused: {'s3' if cloud == 'aws' else 'gs'}://bkt/{node.bundle.key} has SHA-256 {got}, "
        f"this deployment's is {want}; nothing from it was run\n"
    )
    assert verdict.strip() in result.stderr
    # the object is put right: the next try (systemd's restart) installs it
    node.object.write_text(node.bundle.to_json())
    assert node.boot().returncode == 0 and (root / "usr/local/bin/tool").exists()


def test_fetch_script_fails_when_the_object_cannot_be_fetched(fetch_node):
    node, root = fetch_node("aws")
    node.object.unlink()
    result = node.boot()
    assert result.returncode == 1 and "gpuinfra-bundle: cannot fetch s3://bkt/" in result.stderr
    assert not (root / "usr/local/bin/tool").exists() and not (node.tmp / "run/health-failed").exists()


def test_a_reboot_installs_the_verified_copy_without_fetching(fetch_node):
    node, root = fetch_node("gcp")
    assert node.boot().returncode == 0
    (root / "usr/local/bin/tool").unlink()
    node.object.write_text(node.bundle.to_json().replace("echo hi", "echo newer"))  # whatever the bucket holds now
    result = node.boot()
    assert result.returncode == 0, result.stderr
    assert not [c for c in node.calls.read_text().splitlines() if c.startswith("gcloud")]
    assert (root / "usr/local/bin/tool").read_text() == "#!/bin/sh\necho hi\n"
    # a kept copy that no longer matches (disk corruption, an edit) is not used: fetched and checked again
    (node.tmp / "var/node-bundle.json").write_text("{}")
    node.object.write_text(node.bundle.to_json())
    assert node.boot().returncode == 0
    assert node.calls.read_text().splitlines()[:1] == node.fetched()


def test_nodes_cannot_rewrite_the_bundle_they_run():
    """Every node runs the bundle as root: the node role may read it, never write or delete it
    (an explicit Deny beats the bucket-wide Allow; IAM policy evaluation logic)."""
    from blueprints.aws.identity import bucket_policy_document

    doc = json.loads(bucket_policy_document("arn:aws:s3:::b"))
    (deny,) = [st for st in doc["Statement"] if st["Effect"] == "Deny"]
    assert deny == {
        "Sid": "NodeBundleReadOnly",
        "Effect": "Deny",
        "Action": ["s3:PutObject", "s3:DeleteObject"],
        "Resource": ["arn:aws:s3:::b/gpuinfra/*"],
    }
    assert NodeBundle().key.startswith("gpuinfra/")
    allow = next(st for st in doc["Statement"] if st["Sid"] == "ReadWriteStackBucket")
    assert "s3:GetObject" in allow["Action"]  # health results, checkpoints and the bundle are read


@pytest.mark.parametrize("unit", ["image", "fabric-host"])
def test_unit_shell_commands_pass_shellcheck(tmp_path, unit):
    """The retry loops of gpuinfra-image / gpuinfra-fabric-host run as `sh -c '...'`; systemd
    turns "$$" into "$" (systemd.service(5)), then the body must be valid sh."""
    import shlex

    from gpuinfra.plan.fabric import image_build_systemd_unit
    from gpuinfra.plan.fabric_host import fabric_host_systemd_unit, gcp_host_stack
    from gpuinfra.plan.gcp import nccl_env

    if unit == "image":
        text = image_build_systemd_unit(efa_image_build(IMAGE)).render()
    else:
        spec = make_spec("a3-megagpu-8g", nodes=2, profile="llm-pretrain", cloud="gcp")
        text = fabric_host_systemd_unit(gcp_host_stack("tcpxo", spec.facts, nccl_env("tcpxo"))).render()
        assert "rc=$$?" in text and 'exit "$$rc"' in text
    line = next(x for x in text.splitlines() if x.startswith("ExecStart="))
    argv = shlex.split(line.removeprefix("ExecStart=").replace("$$", "$"))
    assert argv[:2] == ["/bin/sh", "-c"] and (len(argv) == 3 or argv[3] == "sh")
    path = tmp_path / "body.sh"
    path.write_text("#!/bin/sh\n" + argv[2] + "\n")
    check = subprocess.run([need_tool("shellcheck"), "--severity=style", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
