"""``gpuinfra-run`` as installed by the boot scripts, run for real (bash) against a fake node
(GPUINFRA_RUN_SYSROOT: /etc/gpuinfra, /dev, /sys/class/net, plugin folders) with stand-ins for
docker and systemctl: the exact devices, mounts, environment and torchrun line per node family,
the prerequisite checks, shellcheck, cloud-init schema and the AWS user-data size."""

from __future__ import annotations

import gzip
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuinfra.agent.constants import RESUME_ENV, RESUME_FILE_PATH
from gpuinfra.plan.aws import plan_aws_cluster
from gpuinfra.plan.boot_aws import USER_DATA_LIMIT_BYTES, aws_node_bundle, render_user_data
from gpuinfra.plan.boot_gcp import gcp_node_bundle, render_startup_script
from gpuinfra.plan.fabric import RUN_SCRIPT_PATH, aws_run_command, efa_image_build, gcp_fabric, gcp_run_command
from gpuinfra.plan.gcp import nccl_env, plan_gcp_cluster
from gpuinfra.plan.naming import stack_id
from tests.blueprints.helpers import gcp_script_files, make_spec, need_tool, preview, shellcheck_cloud_config

IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3@sha256:96990c82825613c3bdeebb66675c7c91b0123f64a5895623316dc5b824e0d7a9"  # the profiles' pinned default
CLUSTER_ENV = {
    "NNODES": "2",
    "NODE_RANK": "1",
    "NPROC_PER_NODE": "8",
    "MASTER_ADDR": "10.0.0.20",
    "MASTER_PORT": "29500",
}
DOCKER = [
    "docker",
    "run",
    "--rm",
    "--gpus",
    "all",
    "--network",
    "host",
    "--ipc",
    "host",
    "--ulimit",
    "memlock=-1",
    "--ulimit",
    "stack=67108864",
]
TORCHRUN = [
    "torchrun",
    "--nnodes",
    "2",
    "--node-rank",
    "1",
    "--nproc-per-node",
    "8",
    "--master-addr",
    "10.0.0.20",
    "--master-port",
    "29500",
    "--no-python",
]
LD_WRAPPER = [
    "/bin/sh",
    "-c",
    'export LD_LIBRARY_PATH="$GPUINFRA_LD_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; exec "$@"',
    "gpuinfra-run",
]
#: what every job gets beside the ranks: scratch, checkpoints, and the checkpoint restored at boot (none here)
SCRATCH_ENV = {"GPUINFRA_SCRATCH": "/scratch", "GPUINFRA_CHECKPOINT_DIR": "/scratch/checkpoints", RESUME_ENV: ""}
STUB_DOCKER = """#!/bin/bash
echo "docker $*" >> "$STUB_CALLS"
case "$1" in run) exit "${STUB_IMAGE_RC:-0}" ;; esac
"""
STUB_SYSTEMCTL = """#!/bin/bash
echo "systemctl $*" >> "$STUB_CALLS"
exit "${STUB_UNIT_RC:-0}"
"""


def uverbs(count):
    return [f"/dev/infiniband/uverbs{i}" for i in range(count)]


def aws_files(instance_type, nodes=2, profile="llm-pretrain", spec=None):
    """path -> content of what the node gets: the cloud-config's write_files and the node bundle."""
    spec = spec or make_spec(instance_type, nodes=nodes, profile=profile)
    plan = plan_aws_cluster(spec)
    text = render_user_data(spec, plan, "bucket-x")
    files = {f["path"]: f["content"] for f in yaml.safe_load(text)["write_files"]}
    return {**files, **{f.path: f.content for f in aws_node_bundle(spec, plan).files}}


def gcp_script(machine_type, nodes=2, profile="llm-finetune", **kw):
    spec = make_spec(machine_type, nodes=nodes, profile=profile, cloud="gcp", **kw)
    return render_startup_script(spec, plan_gcp_cluster(spec), "bucket-x")


def gcp_files(machine_type, nodes=2, profile="llm-finetune", **kw):
    spec = make_spec(machine_type, nodes=nodes, profile=profile, cloud="gcp", **kw)
    plan = plan_gcp_cluster(spec)
    script = render_startup_script(spec, plan, "bucket-x")
    return {
        RUN_SCRIPT_PATH: gcp_node_bundle(spec, plan).file(RUN_SCRIPT_PATH).content,
        "/etc/gpuinfra/nccl.env": gcp_script_files(script)["/etc/gpuinfra/nccl.env"][1],
    }


def parse_env(text):
    return dict(line.split("=", 1) for line in text.splitlines() if line)


class Node:
    """A fake node: ``root`` is the sysroot, ``bin`` holds docker/systemctl stand-ins, ``work``
    the folder gpuinfra-run is started in."""

    def __init__(self, tmp_path: Path, files: dict[str, str]):
        self.root = tmp_path / "root"
        self.bin = tmp_path / "bin"
        self.work = tmp_path / "work"
        self.calls = tmp_path / "calls.log"
        for folder in (self.bin, self.work, self.root / "etc" / "gpuinfra"):
            folder.mkdir(parents=True)
        self.calls.write_text("")
        for name, body in (("docker", STUB_DOCKER), ("systemctl", STUB_SYSTEMCTL)):
            (self.bin / name).write_text(body)
            (self.bin / name).chmod(0o755)
        self.script = tmp_path / "gpuinfra-run"
        self.script.write_text(files[RUN_SCRIPT_PATH])
        self.write("/etc/gpuinfra/nccl.env", files["/etc/gpuinfra/nccl.env"])
        self.write("/etc/gpuinfra/cluster.env", "".join(f"{k}={v}\n" for k, v in CLUSTER_ENV.items()))
        # what gpuinfra-restore.service writes at boot when the bucket holds no checkpoint
        self.write(RESUME_FILE_PATH, f"{RESUME_ENV}=\n")

    def write(self, path: str, text: str = "") -> Path:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target

    def devices(self, paths):
        for path in paths:
            self.write(path)

    def nics(self, names, state="up"):
        for name in names:
            self.write(f"/sys/class/net/{name}/operstate", f"{state}\n")

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        full = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "GPUINFRA_RUN_SYSROOT": str(self.root),
            "STUB_CALLS": str(self.calls),
            **env,
        }
        return subprocess.run(
            ["bash", str(self.script), *args], env=full, cwd=self.work, capture_output=True, text=True, timeout=60
        )

    def dry_run(self, *command: str) -> tuple[list[str], dict[str, str]]:
        """The docker argv gpuinfra-run prints and the env file it passes."""
        result = self.run("--dry-run", "--", *(command or ("python", "train.py")))
        assert result.returncode == 0, result.stderr
        argv = shlex.split(result.stdout)
        env_file = argv[argv.index("--env-file") + 1]
        assert env_file == f"{self.root}/run/gpuinfra/env/run.env"
        return argv, parse_env(Path(env_file).read_text())

    def expected_tail(self, *, wrapper=False, image=IMAGE):
        work = str(self.work)
        return (
            ["-v", f"{work}:{work}", "-w", work, "--env-file", f"{self.root}/run/gpuinfra/env/run.env", image]
            + (LD_WRAPPER if wrapper else [])
            + TORCHRUN
            + ["python", "train.py"]
        )


@pytest.fixture
def node_for(tmp_path):
    if os.name != "posix":
        pytest.skip("bash only")
    return lambda files: Node(tmp_path, files)


def _devices(argv):
    return [argv[i + 1] for i, word in enumerate(argv) if word == "--device"]


def _volumes(argv):
    return [argv[i + 1] for i, word in enumerate(argv) if word == "-v"]


# --------------------------------------------------------------------------------- AWS families


@pytest.mark.parametrize(
    ("instance_type", "profile", "efa", "extra_env"),
    [
        # p5: 32 EFA interfaces, one uverbs device each (awsome Batch p5 template: uverbs0..31)
        ("p5.48xlarge", "llm-pretrain", 32, {}),
        ("p4d.24xlarge", "llm-pretrain", 4, {}),
        # one EFA without GPUDirect RDMA: the device still goes in, NCCL copies through host memory
        ("g5.48xlarge", "llm-finetune", 1, {"NCCL_SHM_USE_CUDA_MEMCPY": "1"}),
        ("g6e.48xlarge", "llm-finetune", 4, {"NCCL_SHM_USE_CUDA_MEMCPY": "1"}),
    ],
)
def test_aws_efa_families_pass_every_uverbs_device(node_for, instance_type, profile, efa, extra_env):
    node = node_for(aws_files(instance_type, profile=profile))
    node.devices(uverbs(efa))
    argv, env = node.dry_run()
    # the default image is the one the node built at boot: the profile's image + the EFA user space
    built = efa_image_build(IMAGE).tag
    assert built.startswith("gpuinfra/train:efa-")
    assert argv == [
        *DOCKER,
        "--cap-add",
        "IPC_LOCK",
        *sum((["--device", d] for d in uverbs(efa)), []),
        "-v",
        "/scratch:/scratch",
        *node.expected_tail(image=built),
    ]
    assert env == {
        "NCCL_SOCKET_IFNAME": "^docker,lo,veth",
        "NCCL_DEBUG": "WARN",
        "FI_EFA_USE_HUGE_PAGE": "0",
        "GPUINFRA_EFA_DEVICES": str(efa),
        **extra_env,
        **CLUSTER_ENV,
        **SCRATCH_ENV,
    }
    # the image was checked for the EFA user space and the aws-ofi-nccl plugin
    calls = node.calls.read_text()
    assert f"docker run --rm --entrypoint /bin/sh {built} -c ls /opt/amazon/efa/lib*/libfabric.so*" in calls
    assert f"docker run --rm --entrypoint /bin/sh {built} -c ls /opt/amazon/ofi-nccl/lib/libnccl-net.so" in calls


def test_aws_without_efa_runs_over_sockets(node_for):
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    argv, env = node.dry_run()
    assert argv == [*DOCKER, "-v", "/scratch:/scratch", *node.expected_tail()]
    assert env == {
        "NCCL_SOCKET_IFNAME": "^docker,lo,veth",
        "NCCL_DEBUG": "WARN",
        "NCCL_SHM_USE_CUDA_MEMCPY": "1",
        **CLUSTER_ENV,
        **SCRATCH_ENV,
    }
    assert node.calls.read_text() == ""  # nothing to check, no docker call before the run


def test_p5_with_a_missing_efa_device_stops_with_one_line(node_for):
    node = node_for(aws_files("p5.48xlarge"))
    node.devices(uverbs(31))
    result = node.run("--dry-run", "--", "python", "train.py")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        "gpuinfra-run: EFA is not ready on this node, missing: "
        "1 of 32 devices (/dev/infiniband/uverbs31 ...). "
        "NCCL would fall back to TCP sockets; devices: check the EFA driver"
    )


def test_an_image_without_efa_user_space_is_refused(node_for):
    node = node_for(aws_files("p4d.24xlarge"))
    node.devices(uverbs(4))
    result = node.run("--dry-run", "--image", IMAGE, "--", "python", "train.py", STUB_IMAGE_RC="2")
    assert result.returncode == 1
    assert (
        f"missing: EFA user space (libfabric) in {IMAGE} (/opt/amazon/efa/lib*/libfabric.so*); "
        f"aws-ofi-nccl NCCL plugin in {IMAGE} (/opt/amazon/ofi-nccl/lib/libnccl-net.so). "
        "NCCL would fall back to TCP sockets"
    ) in result.stderr
    assert "journalctl -u gpuinfra-image" in result.stderr and "--image" in result.stderr


# --------------------------------------------------------------------------------- GCP families

#: A3 High's TCPX needs a baked image (rule fabric-installable-at-boot): these tests name one
BAKED_TCPX_IMAGE = "projects/my-project/global/images/a3-high-tcpx-baked"
TCPX_NICS = ["enp6s0", "enp12s0", "enp134s0", "enp140s0"]
TCPXO_NICS = ["enp6s0", "enp7s0", "enp13s0", "enp14s0", "enp134s0", "enp135s0", "enp141s0", "enp142s0"]


def test_a3_high_tcpx_mounts_the_plugin_and_rxdm_sockets(node_for):
    node = node_for(gcp_files("a3-highgpu-8g", gcp_image=BAKED_TCPX_IMAGE))
    node.write("/var/lib/tcpx/lib64/libnccl-net.so")
    (node.root / "run" / "tcpx").mkdir(parents=True)
    node.nics(TCPX_NICS)
    argv, env = node.dry_run()
    assert argv == [
        *DOCKER,
        "--cap-add",
        "IPC_LOCK",
        "-v",
        "/scratch:/scratch",
        "-v",
        "/var/lib/tcpx/lib64:/var/lib/tcpx/lib64:ro",
        "-v",
        "/run/tcpx:/run/tcpx",
        *node.expected_tail(wrapper=True),
    ]
    assert env == {
        # nccl.env (gpuinfra/plan/gcp.py nccl_env "tcpx")
        "NCCL_NET": "GPUDirectTCPX_v7",
        "NCCL_SOCKET_IFNAME": "enp0s12",
        "NCCL_GPUDIRECTTCPX_CTRL_DEV": "enp0s12",
        "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": "enp6s0,enp12s0,enp134s0,enp140s0",
        "NCCL_CROSS_NIC": "0",
        "NCCL_ALGO": "Ring",
        "NCCL_PROTO": "Simple",
        "NCCL_NSOCKS_PERTHREAD": "4",
        "NCCL_SOCKET_NTHREADS": "1",
        "NCCL_DYNAMIC_CHUNK_SIZE": "524288",
        "NCCL_P2P_NET_CHUNKSIZE": "524288",
        "NCCL_P2P_PCI_CHUNKSIZE": "524288",
        "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
        "NCCL_BUFFSIZE": "4194304",
        "NCCL_NET_GDR_LEVEL": "PIX",
        "NCCL_P2P_PXN_LEVEL": "0",
        "GPUINFRA_NCCL_PLUGIN_DIR": "/var/lib/tcpx/lib64",
        # the runtime's additions (cluster-toolkit a3-highgpu-8g run-nccl-tests.sh L62-67)
        "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX": "/run/tcpx",
        "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS": "500000",
        "NCCL_GPUDIRECTTCPX_TX_BINDINGS": "enp6s0:8-21,112-125;enp12s0:8-21,112-125;enp134s0:60-73,164-177;enp140s0:60-73,164-177",
        "NCCL_GPUDIRECTTCPX_RX_BINDINGS": "enp6s0:22-35,126-139;enp12s0:22-35,126-139;enp134s0:74-87,178-191;enp140s0:74-87,178-191",
        "GPUINFRA_LD_LIBRARY_PATH": "/var/lib/tcpx/lib64",
        **CLUSTER_ENV,
        **SCRATCH_ENV,
    }
    assert "systemctl is-active --quiet gpuinfra-rxdm.service" in node.calls.read_text()


def test_a3_mega_tcpxo_mounts_plugin_and_aperture_devices_and_reads_the_plugin_profile(node_for):
    node = node_for(gcp_files("a3-megagpu-8g", profile="llm-pretrain"))
    # the installer's profile: its interface names are GKE's and get overridden by nccl.env
    node.write(
        "/var/lib/tcpxo/lib64/nccl-env-profile.sh",
        "export NCCL_FASTRAK_NUM_FLOWS=2\nexport NCCL_FASTRAK_IFNAME=eth1,eth2\n"
        'export NCCL_TUNER_CONFIG_PATH="${NCCL_LIB_DIR}/a3plus_tuner_config.textproto"\n'
        'export LD_LIBRARY_PATH="${NCCL_LIB_DIR}"\necho noise\n',
    )
    node.write("/dev/aperture_devices/0000:06:00.1/resource0")
    node.nics(TCPXO_NICS)
    argv, env = node.dry_run()
    assert _devices(argv) == []
    assert argv == [
        *DOCKER,
        "--cap-add",
        "IPC_LOCK",
        "-v",
        "/scratch:/scratch",
        "-v",
        "/var/lib/tcpxo/lib64:/var/lib/tcpxo/lib64:ro",
        "-v",
        "/dev/aperture_devices:/dev/aperture_devices",
        *node.expected_tail(wrapper=True),
    ]
    assert env == {
        "NCCL_FASTRAK_NUM_FLOWS": "2",
        "NCCL_FASTRAK_IFNAME": ",".join(TCPXO_NICS),  # 8 GPU NICs, nccl.env wins over the profile
        "NCCL_TUNER_CONFIG_PATH": "/var/lib/tcpxo/lib64/a3plus_tuner_config.textproto",
        "NCCL_FASTRAK_CTRL_DEV": "enp0s12",
        "NCCL_SOCKET_IFNAME": "enp0s12",
        "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": "/dev/aperture_devices",
        "GPUINFRA_NCCL_ENV_PROFILE": "/var/lib/tcpxo/lib64/nccl-env-profile.sh",
        "GPUINFRA_NCCL_PLUGIN_DIR": "/var/lib/tcpxo/lib64",
        "GPUINFRA_LD_LIBRARY_PATH": "/var/lib/tcpxo/lib64",
        **CLUSTER_ENV,
        **SCRATCH_ENV,
    }
    runtime = gcp_fabric(
        "tcpxo", make_spec("a3-megagpu-8g", cloud="gcp", profile="llm-pretrain").facts, nccl_env("tcpxo")
    )
    assert runtime.gpu_nics == tuple(TCPXO_NICS) and runtime.rxdm_unit == "gpuinfra-rxdm.service"
    assert runtime.rxdm_image == "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.23"


def test_a3_mega_without_its_host_stack_names_everything_missing_in_one_line(node_for):
    node = node_for(gcp_files("a3-megagpu-8g", profile="llm-pretrain"))
    node.nics(TCPXO_NICS[:6])
    node.nics(TCPXO_NICS[6:7], state="down")
    result = node.run("--dry-run", "--", "python", "train.py", STUB_UNIT_RC="3")
    assert result.returncode == 1 and result.stdout == "" and result.stderr.count("\n") == 1
    assert result.stderr == (
        "gpuinfra-run: GPUDirect-TCPXO is not ready on this node, missing: "
        "TCPXO NCCL plugin (/var/lib/tcpxo/lib64/nccl-env-profile.sh); "
        "aperture devices (/dev/aperture_devices empty or absent); "
        "RxDM (receive-datapath-manager) (gpuinfra-rxdm.service not active); "
        "GPU NIC enp141s0 (absent or down); GPU NIC enp142s0 (absent or down). "
        "NCCL would fall back to TCP sockets; the GPUDirect-TCPXO host stack is not ready: see journalctl -u "
        "gpuinfra-fabric-host -u gpuinfra-rxdm, or run sudo /usr/local/sbin/gpuinfra-fabric-host; or use a profile "
        "with high_bandwidth_networking: off\n"
    )


def test_a3_ultra_gib_passes_eight_rdma_devices_and_the_gib_tree(node_for):
    node = node_for(gcp_files("a3-ultragpu-8g", spot=True))
    node.devices(uverbs(8))
    node.write("/usr/local/gib/lib64/libnccl-net.so")
    node.write(
        "/usr/local/gib/scripts/set_nccl_env.sh",
        "export NCCL_NET=gIB\nexport NCCL_IB_TC=52\nexport NCCL_IB_QPS_PER_CONNECTION=4\n",
    )
    argv, env = node.dry_run()
    assert argv == [
        *DOCKER,
        "--cap-add",
        "IPC_LOCK",
        *sum((["--device", d] for d in uverbs(8)), []),
        "-v",
        "/scratch:/scratch",
        "-v",
        "/usr/local/gib:/usr/local/gib:ro",
        *node.expected_tail(wrapper=True),
    ]
    assert env == {
        "NCCL_NET": "gIB",
        "NCCL_IB_TC": "52",
        "NCCL_IB_QPS_PER_CONNECTION": "4",
        "NCCL_CROSS_NIC": "0",
        "NCCL_NET_GDR_LEVEL": "PIX",
        "NCCL_P2P_NET_CHUNKSIZE": "131072",
        "NCCL_NVLS_CHUNKSIZE": "524288",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_IB_ADAPTIVE_ROUTING": "1",
        "NCCL_IB_FIFO_TC": "84",
        "NCCL_TUNER_CONFIG_PATH": "/usr/local/gib/configs/tuner_config.txtpb",
        "GPUINFRA_NCCL_PLUGIN_DIR": "/usr/local/gib/lib64",
        "NCCL_SOCKET_IFNAME": "enp0s19,enp192s20",
        "GPUINFRA_LD_LIBRARY_PATH": "/usr/local/gib/lib64",
        **CLUSTER_ENV,
        **SCRATCH_ENV,
    }


@pytest.mark.parametrize(
    ("machine_type", "kw"),
    [
        ("a2-highgpu-8g", {}),
        ("g2-standard-48", {}),
        ("n1-standard-16", {"gpus": "1xT4", "profile": "dev"}),
    ],
)
def test_gcp_families_without_gpu_nics_run_over_sockets(node_for, machine_type, kw):
    node = node_for(gcp_files(machine_type, **kw))
    argv, env = node.dry_run()
    assert argv == [*DOCKER, "-v", "/scratch:/scratch", *node.expected_tail()]
    assert env == {"NCCL_SOCKET_IFNAME": "^docker,lo,veth", "NCCL_DEBUG": "WARN", **CLUSTER_ENV, **SCRATCH_ENV}
    assert node.calls.read_text() == ""


def test_gcp_fabric_is_read_from_the_facts():
    spec = make_spec("a3-highgpu-8g", cloud="gcp", gcp_image=BAKED_TCPX_IMAGE)
    layout = plan_gcp_cluster(spec).nic_layout
    assert gcp_fabric(layout, spec.facts, nccl_env(layout)).gpu_nics == tuple(TCPX_NICS)
    # high-bandwidth networking off: the plan's layout is gvnic, so sockets
    assert gcp_fabric("gvnic", spec.facts, nccl_env("gvnic")).fabric == "sockets"
    four = spec.facts.model_copy(
        update={"networks": spec.facts.networks[:1] + (spec.facts.networks[1].model_copy(update={"count": 2}),)}
    )
    with pytest.raises(ValueError, match="names 4 NICs, the facts say 2 GPU NICs"):
        gcp_fabric("tcpx", four, nccl_env("tcpx"))


# --------------------------------------------------------------------------------- the script itself


def test_waits_for_the_ranks_and_says_why_it_gave_up(node_for):
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    (node.root / "etc" / "gpuinfra" / "cluster.env").unlink()
    result = node.run("--wait", "0", "--dry-run", "--", "python", "train.py")
    assert result.returncode == 1
    assert result.stderr == (
        "gpuinfra-run: no ranks after 0 s: /etc/gpuinfra/cluster.env is written once all "
        "nodes are known (journalctl -u gpuinfra-cluster-env)\n"
    )


def test_options_image_no_torchrun_and_checkpoints_outside_scratch(node_for):
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    node.write("/etc/gpuinfra/node.env", "GPUINFRA_SCRATCH=/scratch\nGPUINFRA_CHECKPOINT_DIR=/data/ckpt\n")
    result = node.run("--image", "my/image:1", "--no-torchrun", "--dry-run", "--", "bash", "-c", "echo $RANK")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert _volumes(argv) == ["/scratch:/scratch", "/data/ckpt:/data/ckpt", f"{node.work}:{node.work}"]
    assert argv[argv.index("my/image:1") :] == ["my/image:1", "bash", "-c", "echo $RANK"]
    assert "GPUINFRA_CHECKPOINT_DIR=/data/ckpt" in (node.root / "run" / "gpuinfra" / "env" / "run.env").read_text()
    assert (node.root / "data" / "ckpt").is_dir()


def test_an_image_that_cannot_be_pulled_is_named(node_for):
    node = node_for(aws_files("p4d.24xlarge"))
    node.devices(uverbs(4))
    result = node.run("--dry-run", "--image", IMAGE, "--", "python", "train.py", STUB_IMAGE_RC="125")
    assert result.returncode == 1 and result.stderr == f"gpuinfra-run: docker cannot pull or start {IMAGE}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "no command; usage: gpuinfra-run"),
        (("--bogus", "--", "x"), "unknown argument '--bogus'"),
        (("--wait", "soon", "--", "x"), "--wait takes whole seconds"),
        # docker refuses these names (moby daemon/names: [a-zA-Z0-9][a-zA-Z0-9_.-]+); '/' and '..'
        # would also move the run's env file out of its folder
        *(
            (("--name", bad, "--", "x"), "--name takes a docker container name")
            for bad in ("../../etc/x", "a/b", "-x", "_x", "a", "a b", "a;touch x", "a\nb", "ä1")
        ),
    ],
)
def test_usage_errors(node_for, args, message):
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    result = node.run(*args)
    assert result.returncode == 1 and message in result.stderr


@pytest.mark.parametrize("name", ["gpuinfra-health", "job.1_a", "9x", "A-"])
def test_a_docker_container_name_is_taken(node_for, name):
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    result = node.run("--dry-run", "--name", name, "--", "x")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[argv.index("--name") + 1] == name
    assert argv[argv.index("--env-file") + 1] == f"{node.root}/run/gpuinfra/env/run-{name}.env"


def test_a_profile_without_image_needs_image(node_for):
    spec = make_spec("g5.xlarge", profile="dev")
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"container_image": ""})})
    node = node_for(aws_files("g5.xlarge", spec=spec))
    result = node.run("--dry-run", "--", "python", "train.py")
    assert result.returncode == 1
    assert result.stderr == "gpuinfra-run: the profile has no container image; pass --image IMAGE\n"


@pytest.mark.parametrize(
    "files",
    [
        pytest.param(lambda: aws_files("p5.48xlarge"), id="p5"),
        pytest.param(lambda: aws_files("g5.xlarge", nodes=1, profile="dev"), id="g5-sockets"),
        pytest.param(lambda: gcp_files("a3-highgpu-8g", gcp_image=BAKED_TCPX_IMAGE), id="a3-high"),
        pytest.param(lambda: gcp_files("a3-megagpu-8g", profile="llm-pretrain"), id="a3-mega"),
        pytest.param(lambda: gcp_files("a3-ultragpu-8g", spot=True), id="a3-ultra"),
        pytest.param(lambda: gcp_files("g2-standard-48"), id="g2"),
    ],
)
def test_rendered_script_passes_shellcheck(files, tmp_path):
    path = tmp_path / "gpuinfra-run"
    path.write_text(files()[RUN_SCRIPT_PATH])
    check = subprocess.run([need_tool("shellcheck"), "--severity=style", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_p5_node_bundle_installs_gpuinfra_run_and_user_data_stays_within_the_ec2_limit(tmp_path):
    spec = make_spec("p5.48xlarge", nodes=2, profile="llm-pretrain")
    plan = plan_aws_cluster(spec)
    text = render_user_data(spec, plan, "bucket-x")
    size = len(gzip.compress(text.encode(), mtime=0))
    # EC2's 16 KB, with 1 KB to spare: gpuinfra-run and the rest moved to the bundle
    assert USER_DATA_LIMIT_BYTES == 16 * 1024 and size <= USER_DATA_LIMIT_BYTES - 1024, size
    entry = aws_node_bundle(spec, plan).file(RUN_SCRIPT_PATH)
    assert entry.mode == "0755" and "DEVICES=(/dev/infiniband/uverbs{0..31})" in entry.content
    shellcheck_cloud_config(text, tmp_path)


def test_gcp_startup_script_fetches_the_bundle_with_gpuinfra_run(tmp_path):
    spec = make_spec("a3-megagpu-8g", nodes=2, profile="llm-pretrain", cloud="gcp")
    plan = plan_gcp_cluster(spec)
    script = render_startup_script(spec, plan, "bucket-x")
    assert f"URL=gs://bucket-x/{gcp_node_bundle(spec, plan).key}" in script and 'gcloud storage cp "$URL"' in script
    assert gcp_node_bundle(spec, plan).file(RUN_SCRIPT_PATH).mode == "0755"
    path = tmp_path / "startup.sh"
    path.write_text(script)
    check = subprocess.run([need_tool("shellcheck"), "--severity=style", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


# --------------------------------------------------------------------------------- stack outputs


def test_run_command_outputs():
    aws = make_spec("p5.48xlarge", nodes=2)
    result = preview(aws)
    assert (
        result.outputs["run_command"]
        == aws_run_command(aws.region, stack_id(aws))
        == (
            f"aws ssm send-command --region {aws.region} --document-name AWS-RunShellScript "
            f"--targets Key=tag:gpuinfra:stack-id,Values={aws.stack}-{aws.name_suffix} "
            # executionTimeout: AWS-RunShellScript's maximum, 172800 s (its default, 3600 s, also
            # counts gpuinfra-run's wait for the ranks and the health verdict)
            '--parameters \'workingDirectory=["/scratch"],commands=["gpuinfra-run -- python train.py"],'
            'executionTimeout=["172800"]\''
        )
    )
    gcp = make_spec("a3-megagpu-8g", nodes=2, cloud="gcp", profile="llm-pretrain")
    out = preview(gcp).outputs["run_command"]
    assert out == gcp_run_command(gcp.zone, "t-2--t3st0a-node", gcp.network.iap_ssh)  # the stack's own group
    # its MIG's members and its bulk-inserted nodes (t-2--t3st0a-node-n000, ...): names under "<group>-"
    assert out.startswith(
        f"for vm in $(gcloud compute instances list --zones {gcp.zone} --filter='name~^t-2--t3st0a-node-' "
    )
    assert "--tunnel-through-iap --command 'cd /scratch && sudo gpuinfra-run -- python train.py' & done; wait" in out


# --------------------------------------------------------------------------------- health gate


def test_enforce_refuses_a_node_that_failed_the_health_gate(node_for):
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    node.write("/etc/gpuinfra/node.env", "GPUINFRA_HEALTH_GATE=enforce\n")
    node.write("/run/gpuinfra/health-failed", "ecc: 2 uncorrectable volatile ECC errors on GPU 3\n")
    result = node.run("--dry-run", "--", "python", "train.py")
    assert result.returncode == 1 and result.stderr == (
        "gpuinfra-run: this node failed the health gate: ecc: 2 uncorrectable volatile ECC errors on GPU 3 "
        "(gpuinfra check STACK; --skip-health-gate to run anyway)\n"
    )
    assert node.run("--dry-run", "--skip-health-gate", "--", "python", "train.py").returncode == 0
    # no verdict yet: waits, then gives up with the unit to look at
    (node.root / "run/gpuinfra/health-failed").unlink()
    waited = node.run("--wait", "0", "--dry-run", "--", "python", "train.py")
    assert (
        waited.returncode == 1
        and "the health gate has not passed after 0 s (journalctl -u gpuinfra-health" in waited.stderr
    )
    node.write("/run/gpuinfra/health-passed", "2026-11-23T08:00:00+00:00\n")
    assert node.run("--dry-run", "--", "python", "train.py").returncode == 0


def test_report_warns_and_runs_and_extra_env_comes_last(node_for):
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    node.write("/etc/gpuinfra/node.env", "GPUINFRA_HEALTH_GATE=report\n")
    node.write("/run/gpuinfra/health-failed", "allreduce_busbw: 3.10 GB/s\n")
    result = node.run("--dry-run", "-e", "NCCL_DEBUG=INFO", "--", "python", "train.py")
    assert result.returncode == 0
    assert result.stderr.startswith("gpuinfra-run: warning: the health gate failed (allreduce_busbw: 3.10 GB/s")
    env = parse_env((node.root / "run/gpuinfra/env/run.env").read_text())
    assert env["NCCL_DEBUG"] == "INFO"  # nccl.env says WARN; -e wins
    bad = node.run("--dry-run", "-e", "not-a-var", "--", "python", "train.py")
    assert bad.returncode == 1
    assert bad.stderr == "gpuinfra-run: -e takes KEY=VALUE or KEY, KEY a variable name (the argument is not shown)\n"


#: docker stand-in for a real run: records argv, copies what it read from --env-file (as the
#: docker CLI reads it once, at start) and whether that path was still a file on disk
STUB_DOCKER_READS_ENV = """#!/bin/bash
echo "docker $*" >> "$STUB_CALLS"
prev=""
for a; do
  if [ "$prev" = --env-file ]; then cat "$a" > "$STUB_ENV_COPY"; echo "$a" > "$STUB_ENV_PATH"; fi
  prev="$a"
done
"""
SECRET = "hf_Zq7TokenThatMustNotLeak"


def test_secrets_from_e_are_root_only_never_logged_and_gone_after_a_run(node_for):
    """``-e HF_TOKEN=...``: the env file is 0600 in a 0700 folder (a dry run keeps it to be
    read); a real run hands it to docker through a descriptor with the file already deleted; the
    value is on no command line and in no output, a malformed or multi-line -e included."""
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    (node.bin / "docker").write_text(STUB_DOCKER_READS_ENV)
    copy, seen = node.root.parent / "env-copy", node.root.parent / "env-path"
    stub = {"STUB_ENV_COPY": str(copy), "STUB_ENV_PATH": str(seen)}
    folder = node.root / "run/gpuinfra/env"
    dry = node.run("--dry-run", "-e", f"HF_TOKEN={SECRET}", "--", "python", "train.py", **stub)
    assert dry.returncode == 0, dry.stderr
    kept = folder / "run.env"
    assert oct(folder.stat().st_mode & 0o777) == "0o700" and oct(kept.stat().st_mode & 0o777) == "0o600"
    assert parse_env(kept.read_text())["HF_TOKEN"] == SECRET
    assert SECRET not in dry.stdout + dry.stderr
    kept.unlink()
    real = node.run("--name", "job", "-e", f"HF_TOKEN={SECRET}", "--", "python", "train.py", **stub)
    assert real.returncode == 0, real.stderr
    assert parse_env(copy.read_text())["HF_TOKEN"] == SECRET  # docker got it
    assert seen.read_text() == "/dev/fd/3\n" and list(folder.iterdir()) == []  # from a descriptor, file gone
    assert SECRET not in real.stdout + real.stderr + node.calls.read_text()  # not in docker's argv either
    # -e KEY: the value from the environment (sudo --preserve-env=KEY), on no command line at all
    kept = node.run("--dry-run", "-e", "HF_TOKEN", "--", "python", "train.py", HF_TOKEN=SECRET, **stub)
    assert kept.returncode == 0, kept.stderr
    assert parse_env((folder / "run.env").read_text())["HF_TOKEN"] == SECRET and SECRET not in kept.stdout + kept.stderr
    unset = node.run("-e", "HF_TOKEN", "--", "python", "train.py", **stub)
    assert unset.returncode == 1 and "-e KEY: KEY is not set in gpuinfra-run's environment" in unset.stderr
    for args in (["-e", SECRET], ["-e", f"-{SECRET}"], ["-e", f"1X={SECRET}"], ["-e", f"A={SECRET}\nB=1"]):
        bad = node.run(*args, "--", "python", "train.py", **stub)
        assert bad.returncode == 1 and SECRET not in bad.stdout + bad.stderr, args


def test_the_job_gets_the_progress_file_and_a_new_job_starts_without_the_last_ones(node_for):
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    node.write(
        "/etc/gpuinfra/node.env",
        "GPUINFRA_SCRATCH=/scratch\nGPUINFRA_CHECKPOINT_DIR=/scratch/checkpoints\n"
        "GPUINFRA_PROGRESS_FILE=/scratch/gpuinfra-progress\n",
    )
    stale = node.write("/scratch/gpuinfra-progress", "")
    argv, env = node.dry_run()
    assert env["GPUINFRA_PROGRESS_FILE"] == "/scratch/gpuinfra-progress" and stale.exists()  # a dry run changes nothing
    result = node.run("--", "python", "train.py")
    assert result.returncode == 0, result.stderr
    assert not stale.exists()  # the node agent's hang check does not read the last job's file


def test_the_job_gets_the_checkpoint_restored_at_boot_and_waits_for_the_restore(node_for):
    node = node_for(aws_files("g5.xlarge", nodes=1, profile="dev"))
    node.write(RESUME_FILE_PATH, f"{RESUME_ENV}=/scratch/checkpoints/step-000600\n")
    argv, env = node.dry_run()
    assert env[RESUME_ENV] == "/scratch/checkpoints/step-000600"
    # no restore result yet: waits up to --wait, then starts without one and says where to look
    (node.root / RESUME_FILE_PATH.lstrip("/")).unlink()
    result = node.run("--wait", "0", "--dry-run", "--", "python", "train.py")
    assert result.returncode == 0, result.stderr
    assert "no checkpoint restore after 0 s (journalctl -u gpuinfra-restore); starting without one" in result.stderr
    assert parse_env((node.root / "run/gpuinfra/env/run.env").read_text())[RESUME_ENV] == ""
    # a job run past a failed gate waits too; only the health gate's own all-reduce does not
    skipped = node.run("--skip-health-gate", "--wait", "0", "--dry-run", "--", "python", "x.py")
    assert skipped.returncode == 0 and "no checkpoint restore after 0 s" in skipped.stderr
    gate = node.run("--skip-health-gate", "--no-restore-wait", "--dry-run", "--", "python", "x.py")
    assert gate.returncode == 0 and "checkpoint restore" not in gate.stderr


def test_the_job_units_elastic_form_bounds_each_rendezvous_store_call(node_for):
    """``--rdzv-id``/``--nnodes``: torchrun's c10d rendezvous hosted on rank 0, every store call
    bounded by ``read_timeout`` (C10dRendezvousBackend, pytorch.org/docs/stable/elastic/rendezvous.html),
    so a node whose rank-0 node is lost fails within it and its job unit restarts the job."""
    from gpuinfra.plan.fabric import RDZV_READ_TIMEOUT_SECONDS

    node = node_for(aws_files("g5.xlarge", nodes=2, profile="dev"))
    args = ("--image", "my/image:1", "--rdzv-id", "j-abc", "--nnodes", "1:2", "--dry-run", "--", "python", "t.py")
    argv = shlex.split(node.run(*args).stdout)
    torchrun = argv[argv.index("torchrun") :]
    conf = torchrun[torchrun.index("--rdzv_conf") + 1]
    # rank 1 (the cluster.env these tests write) does not host the store; a comma-separated list
    assert conf == f"is_host=0,read_timeout={RDZV_READ_TIMEOUT_SECONDS}"
    assert 0 < RDZV_READ_TIMEOUT_SECONDS <= 60  # at most PyTorch's default: it bounds detection
    assert torchrun[torchrun.index("--rdzv_endpoint") + 1] == "10.0.0.20:29500"
