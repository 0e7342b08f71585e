"""GCP fabric host install (:mod:`gpuinfra.plan.fabric_host`): per family
the exact units, images, paths and devices, shellcheck of every rendered script, and each script
run for real (bash) on a fake node (GPUINFRA_HOST_SYSROOT) with stand-ins for docker, apt-get,
dkms, modprobe, udevadm, systemctl ... that record their arguments: the exact commands of a
fresh boot, of the next boot (nothing installed twice) and of an image bake.

The expected values are the reference implementations' (cluster-toolkit@1047080,
slurm-gcp@13fd92b6, container-engine-accelerators@992db812; fabric_host.py cites file and
lines), written out here, not read from the module."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuinfra.catalog.store import load_catalog
from gpuinfra.plan.fabric import RXDM_UNIT, gcp_fabric
from gpuinfra.plan.fabric_host import HOST_SCRIPT_PATH, HostStack, gcp_host_stack
from gpuinfra.plan.gcp import nccl_env
from gpuinfra.rules.spec_rules import fabric_boot_blocker
from tests.blueprints.helpers import need_tool

AR = "us-docker.pkg.dev/gce-ai-infra"
TCPX_INSTALLER = f"{AR}/gpudirect-tcpx/nccl-plugin-gpudirecttcpx-dev:v3.1.9-2.19.4-12.0"
TCPX_RXDM = f"{AR}/gpudirect-tcpx/tcpgpudmarxd-dev:v2.0.12"
TCPXO_INSTALLER = f"{AR}/gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev:v1.0.17"
TCPXO_RXDM = f"{AR}/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.23"
TCPX_NICS = ["enp6s0", "enp12s0", "enp134s0", "enp140s0"]
TCPXO_NICS = ["enp6s0", "enp7s0", "enp13s0", "enp14s0", "enp134s0", "enp135s0", "enp141s0", "enp142s0"]
UNIT_PATH = f"/etc/systemd/system/{RXDM_UNIT}"
APERTURE_RULE = "/etc/udev/rules.d/00-gpuinfra-tcpxo-aperture.rules"
KERNEL = "6.8.0-1015-gcp"

# Stand-ins: each logs "name args" to $STUB_CALLS; state lives in $STUB_STATE; files they would
# create on a node go under $GPUINFRA_HOST_SYSROOT.
STUBS = {
    "docker": r"""
case "$1" in
  image) [ -e "$STUB_STATE/pulled-${3//[\/:]/_}" ] ;;
  pull) touch "$STUB_STATE/pulled-${3//[\/:]/_}" ;;
  run) [ "${STUB_DOCKER_RUN_RC:-0}" = 0 ] || exit "$STUB_DOCKER_RUN_RC"
       mkdir -p "$(dirname "$GPUINFRA_HOST_SYSROOT$STUB_PROBE")"; touch "$GPUINFRA_HOST_SYSROOT$STUB_PROBE" ;;
  logs) echo "I0101 Buffer manager initialization complete" ;;
esac
""",
    "systemctl": r"""
case "$1" in
  is-enabled) [ -e "$STUB_STATE/enabled-$3" ] ;;
  enable) touch "$STUB_STATE/enabled-$3" ;;
esac
""",
    "apt-get": r"""
case "$1" in
  download) touch dmabuf-import-helper_1.1_all.deb ;;
  install) for arg; do case "$arg" in nccl-gib=*)
      mkdir -p "$GPUINFRA_HOST_SYSROOT/usr/local/gib/lib64" "$GPUINFRA_HOST_SYSROOT/usr/local/gib/scripts"
      touch "$GPUINFRA_HOST_SYSROOT/usr/local/gib/lib64/libnccl-net.so" "$GPUINFRA_HOST_SYSROOT/usr/local/gib/scripts/set_nccl_env.sh"
      echo "${arg#nccl-gib=}" > "$STUB_STATE/nccl-gib" ;; esac; done ;;
esac
""",
    "dpkg-query": r"""[ -e "$STUB_STATE/nccl-gib" ] && printf '%s' "$(cat "$STUB_STATE/nccl-gib")"; exit 0""",
    "apt-mark": "",
    "dpkg-deb": r"""
mkdir -p "$3/usr/src/dmabuf-import-helper-1.1"
echo 'MODULE_IMPORT_NS(DMA_BUF);' > "$3/usr/src/dmabuf-import-helper-1.1/import-helper.c"
""",
    "dkms": r"""[ "$1" = install ] && touch "$STUB_STATE/dkms-installed"; exit 0""",
    "modinfo": r"""[ -e "$STUB_STATE/dkms-installed" ]""",
    "modprobe": r"""mkdir -p "$GPUINFRA_HOST_SYSROOT/dev"; touch "$GPUINFRA_HOST_SYSROOT/dev/dmabuf_import_helper" """,
    "udevadm": r"""
[ "$1" = trigger ] && [ -z "${STUB_NO_APERTURE:-}" ] && mkdir -p "$GPUINFRA_HOST_SYSROOT/dev/aperture_devices/0000:06:00.1"
exit 0
""",
    "uname": r"""echo "$STUB_KERNEL" """,
    "curl": r"""echo "-----BEGIN PGP PUBLIC KEY BLOCK-----" """,
    "gpg": r"""
while [ $# -gt 0 ]; do if [ "$1" = -o ]; then cat > "$2"; exit 0; fi; shift; done
""",
    "gcloud": r"""
mkdir -p "$GPUINFRA_HOST_SYSROOT/root/.docker"
echo '{"credHelpers": {"us-docker.pkg.dev": "gcloud"}}' > "$GPUINFRA_HOST_SYSROOT/root/.docker/config.json"
""",
}


def facts(machine_type):
    return load_catalog().facts[("gcp", machine_type)]


def stack(machine_type) -> HostStack:
    f = facts(machine_type)
    return gcp_host_stack(f.nic_layout, f, nccl_env(f.nic_layout))


class Node:
    """A fake GCP node: ``root`` is the sysroot, ``bin`` the stand-ins."""

    def __init__(self, tmp_path: Path, script: str, probe: str = ""):
        self.root, self.bin, self.state = tmp_path / "root", tmp_path / "bin", tmp_path / "state"
        self.calls = tmp_path / "calls.log"
        for folder in (self.root, self.bin, self.state):
            folder.mkdir()
        for name, body in STUBS.items():
            (self.bin / name).write_text(f'#!/bin/bash\necho "{name} $*" >> "$STUB_CALLS"\n{body}\n')
            (self.bin / name).chmod(0o755)
        self.script = tmp_path / "gpuinfra-fabric-host"
        self.script.write_text(script)
        self.probe = probe

    def run(self, *args: str, kernel: str = KERNEL, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        """Run the script; returns the result and the commands it issued (sysroot as ROOT)."""
        self.calls.write_text("")
        full = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "GPUINFRA_HOST_SYSROOT": str(self.root),
            "STUB_CALLS": str(self.calls),
            "STUB_STATE": str(self.state),
            "STUB_KERNEL": kernel,
            "STUB_PROBE": self.probe,
            **env,
        }
        result = subprocess.run(["bash", str(self.script), *args], env=full, capture_output=True, text=True, timeout=60)
        calls = self.calls.read_text().replace(str(self.root), "ROOT").splitlines()
        # curl | gpg run side by side: log the pair in pipeline order
        for i in range(len(calls) - 1):
            if calls[i].startswith("gpg ") and calls[i + 1].startswith("curl "):
                calls[i], calls[i + 1] = calls[i + 1], calls[i]
        return result, calls

    def path(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")


@pytest.fixture
def node(tmp_path):
    if os.name != "posix":
        pytest.skip("bash only")

    def make(machine_type, probe=""):
        return Node(tmp_path, stack(machine_type).files[HOST_SCRIPT_PATH], probe)

    return make


def one_line_error(result, code):
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- per family: what is installed ---------------------------------------------------------------


@pytest.mark.parametrize(
    "machine_type", ["a2-highgpu-8g", "a2-ultragpu-8g", "g2-standard-48", "n1-standard-8", "a3-highgpu-4g"]
)
def test_gvnic_families_install_nothing(machine_type):
    """One gVNIC, no GPU NICs: NCCL runs on TCP sockets, the driver in the image is all they need."""
    s = stack(machine_type)
    assert s == HostStack("sockets")
    assert (s.files, s.units, s.images, s.boot_command, s.bake_command) == ({}, (), (), "", "")
    assert s.boot_ok and fabric_boot_blocker("gcp", "gvnic") is None


def test_high_bandwidth_off_installs_nothing_on_a3_mega():
    f = facts("a3-megagpu-8g")
    assert gcp_host_stack("gvnic", f, nccl_env("gvnic")) == HostStack("sockets")


def test_a3_mega_stack():
    s = stack("a3-megagpu-8g")
    assert s.fabric == "tcpxo" and s.boot_ok and s.boot_blocker is None
    assert s.units == ("gpuinfra-rxdm.service",)
    assert s.images == (TCPXO_INSTALLER, TCPXO_RXDM)
    assert list(s.files) == ["/usr/local/sbin/gpuinfra-fabric-host"]
    assert set(s.writes) == {UNIT_PATH, APERTURE_RULE}
    assert (s.boot_command, s.bake_command) == (
        "/usr/local/sbin/gpuinfra-fabric-host",
        "/usr/local/sbin/gpuinfra-fabric-host --bake",
    )
    unit = s.writes[UNIT_PATH].splitlines()
    # slurm-gcp receive-data-path-manager-mega L60-73: flags and the 8 GPU NICs
    assert (
        "ExecStart=/usr/bin/docker run --rm --name gpuinfra-rxdm --cap-add=NET_ADMIN --network=host "
        "--privileged --gpus all --volume /dev/dmabuf_import_helper:/dev/dmabuf_import_helper "
        f"--env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu {TCPXO_RXDM} --num_hops=2 --num_nics=8 --uid= "
        "--alsologtostderr"
    ) in unit
    assert (
        "ExecStartPre=/usr/lib/systemd/systemd-networkd-wait-online -o routable --timeout=120 "
        + " ".join(f"-i {n}" for n in TCPXO_NICS)
    ) in unit
    assert "ExecStartPre=/usr/sbin/modprobe import-helper" in unit
    assert "ExecStartPost=/usr/local/sbin/gpuinfra-fabric-host --wait-rxdm" in unit
    assert {
        "Requires=docker.service",
        "After=docker.service network-online.target nvidia-persistenced.service",
        "WantedBy=multi-user.target",
        "Restart=on-failure",
    } <= set(unit)
    rule = s.writes[APERTURE_RULE]
    # cluster-toolkit a3mega-slurm-blueprint.yaml L408-411
    assert 'SUBSYSTEM=="pci", ATTR{vendor}=="0x1ae0", ATTR{device}=="0x0084"' in rule
    assert "--options=bind --collect %S/%p /dev/aperture_devices/%k" in rule
    assert "chmod 0666 /dev/aperture_devices/%k/resource*" in rule


def test_a3_high_stack_is_blocked_at_boot():
    s = stack("a3-highgpu-8g")
    assert s.fabric == "tcpx" and not s.boot_ok
    assert s.boot_blocker == fabric_boot_blocker("gcp", "tcpx")
    assert "linux-gcp-tcpx" in s.boot_blocker and "reboot" in s.boot_blocker
    assert "a3-highgpu-8g/README.md" in s.boot_blocker
    assert s.units == ("gpuinfra-rxdm.service",) and s.images == (TCPX_INSTALLER, TCPX_RXDM)
    unit = s.writes[UNIT_PATH].splitlines()
    # slurm-gcp receive-data-path-manager L49-64, container-engine-accelerators nccl-test-latest.yaml L66-74
    assert (
        "ExecStart=/usr/bin/docker run --rm --name gpuinfra-rxdm --cap-add=NET_ADMIN --network=host --privileged "
        "--gpus all --volume /run/tcpx:/run/tcpx --env LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/run/tcpx:"
        "/usr/lib/lib32:/usr/lib/x86_64-linux-gnu/ --entrypoint /tcpgpudmarxd/build/app/tcpgpudmarxd "
        f"--ulimit memlock=-1 {TCPX_RXDM} --gpu_nic_preset a3vm --gpu_shmem_type fd --uds_path /run/tcpx "
        "--setup_param '--verbose 128 2 0 '"
    ) in unit
    assert "ExecStartPre=/usr/bin/mkdir -p /run/tcpx" in unit
    assert (
        "ExecStartPre=/usr/lib/systemd/systemd-networkd-wait-online -o routable --timeout=120 "
        + " ".join(f"-i {n}" for n in TCPX_NICS)
    ) in unit
    assert "ExecStartPost=/usr/bin/sleep 10" in unit


@pytest.mark.parametrize("machine_type", ["a3-ultragpu-8g", "a4-highgpu-8g"])
def test_gib_stack(machine_type):
    s = stack(machine_type)
    assert (s.fabric, s.units, s.images, s.writes, s.boot_blocker) == ("gib", (), (), {}, None)
    script = s.files[HOST_SCRIPT_PATH]
    assert '"nccl-gib=1.1.0"' in script
    assert (
        "deb [signed-by=/etc/apt/keyrings/gpuinfra-artifact-registry.gpg] "
        "ar+https://us-apt.pkg.dev/projects/gce-ai-infra gpudirect-gib-apt main"
    ) in script


def test_boot_blocker():
    assert fabric_boot_blocker("gcp", "tcpx") is not None
    assert [fabric_boot_blocker("gcp", layout) for layout in ("tcpxo", "gib", "gvnic")] == [None, None, None]
    assert [fabric_boot_blocker("aws", layout) for layout in ("efa", "ena")] == [None, None]
    with pytest.raises(ValueError, match="unknown cloud 'azure'; allowed: aws, gcp"):
        fabric_boot_blocker("azure", "gib")


@pytest.mark.parametrize("machine_type", ["a3-highgpu-8g", "a3-megagpu-8g", "a3-ultragpu-8g", "a4-highgpu-8g"])
def test_rendered_scripts_pass_shellcheck(machine_type, tmp_path):
    path = tmp_path / "gpuinfra-fabric-host"
    path.write_text(stack(machine_type).files[HOST_SCRIPT_PATH])
    assert path.read_text().startswith("#!/bin/bash\n")
    check = subprocess.run([need_tool("shellcheck"), "--severity=style", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


# --- A3 Mega run on a fake node ------------------------------------------------------------------

TCPXO_FRESH = [
    "modinfo import-helper",
    "uname -r",
    "curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg",
    "gpg --dearmor --yes -o ROOT/etc/apt/keyrings/gpuinfra-google-cloud.gpg",
    "apt-get update -q",
    f"apt-get install -y -q apt-transport-artifact-registry dkms linux-headers-{KERNEL}",
    "apt-get update -q",
    "apt-get download -q dmabuf-import-helper",
    "dpkg-deb -x ./dmabuf-import-helper_1.1_all.deb .",
    "dkms status -m dmabuf-import-helper -v 1.1",
    "dkms add -m dmabuf-import-helper -v 1.1",
    f"dkms build -m dmabuf-import-helper -v 1.1 -k {KERNEL}",
    f"dkms install -m dmabuf-import-helper -v 1.1 -k {KERNEL}",
]
TCPXO_START = [
    "gcloud auth configure-docker us-docker.pkg.dev --quiet",
    f"docker run --rm --name gpuinfra-nccl-installer --network=host -v /var/lib:/var/lib {TCPXO_INSTALLER} "
    "install --install-nccl",
    f"docker image inspect {TCPXO_RXDM}",
    f"docker pull -q {TCPXO_RXDM}",
    "systemctl daemon-reload",
    "systemctl is-enabled --quiet gpuinfra-rxdm.service",
    "systemctl enable --quiet gpuinfra-rxdm.service",
]


def test_a3_mega_fresh_boot_then_next_boot(node):
    n = node("a3-megagpu-8g", probe="/var/lib/tcpxo/lib64/nccl-env-profile.sh")
    result, calls = n.run()
    assert result.returncode == 0, result.stderr
    assert calls == TCPXO_FRESH + [
        "modprobe import-helper",
        "udevadm control --reload-rules",
        "udevadm trigger --action=add --subsystem-match=pci --attr-match=vendor=0x1ae0 --attr-match=device=0x0084",
        "udevadm settle --timeout=60",
    ] + TCPXO_START + ["systemctl restart gpuinfra-rxdm.service"]
    s = stack("a3-megagpu-8g")
    for path, content in s.writes.items():
        assert n.path(path).read_text() == content
    assert n.path("/etc/apt/sources.list.d/gpuinfra-gpudirect-tcpxo.list").read_text() == (
        "deb [arch=all trusted=yes] ar+https://us-apt.pkg.dev/projects/gce-ai-infra gpudirect-tcpxo-apt main\n"
    )
    assert n.path("/etc/apt/sources.list.d/gpuinfra-artifact-registry.list").read_text() == (
        "deb [signed-by=/etc/apt/keyrings/gpuinfra-google-cloud.gpg] http://packages.cloud.google.com/apt "
        "apt-transport-artifact-registry-stable main\n"
    )
    # kernel 6.8: the source stays as shipped
    assert n.path("/usr/src/dmabuf-import-helper-1.1/import-helper.c").read_text() == "MODULE_IMPORT_NS(DMA_BUF);\n"
    # what gpuinfra-run requires of the node (except the unit and NICs, which need a real node) is there
    f = facts("a3-megagpu-8g")
    for need in gcp_fabric("tcpxo", f, nccl_env("tcpxo")).requirements:
        if need.kind == "path":
            assert n.path(need.target).is_file(), need
        elif need.kind == "dir":
            assert any(n.path(need.target).iterdir()), need
    # next boot: module built, devices bound, plugin and image there: only load, check and start
    result, calls = n.run()
    assert result.returncode == 0, result.stderr
    assert calls == [
        "modinfo import-helper",
        "modprobe import-helper",
        f"docker image inspect {TCPXO_RXDM}",
        "systemctl is-enabled --quiet gpuinfra-rxdm.service",
        "systemctl start gpuinfra-rxdm.service",
    ]


def test_a3_mega_patches_the_module_for_kernel_6_13_and_later(node):
    n = node("a3-megagpu-8g", probe="/var/lib/tcpxo/lib64/nccl-env-profile.sh")
    result, calls = n.run(kernel="6.17.0-1004-gcp")
    assert result.returncode == 0, result.stderr
    assert "apt-get install -y -q apt-transport-artifact-registry dkms linux-headers-6.17.0-1004-gcp" in calls
    assert n.path("/usr/src/dmabuf-import-helper-1.1/import-helper.c").read_text() == ('MODULE_IMPORT_NS("DMA_BUF");\n')


def test_a3_mega_bake_installs_and_starts_nothing(node):
    n = node("a3-megagpu-8g", probe="/var/lib/tcpxo/lib64/nccl-env-profile.sh")
    result, calls = n.run("--bake")
    assert result.returncode == 0, result.stderr
    assert calls == TCPXO_FRESH + ["udevadm control --reload-rules"] + TCPXO_START
    assert not n.path("/dev/aperture_devices").exists()
    # the first boot of the baked image: nothing to install, only load, bind and start
    _, calls = n.run()
    assert calls == [
        "modinfo import-helper",
        "modprobe import-helper",
        "udevadm trigger --action=add --subsystem-match=pci --attr-match=vendor=0x1ae0 --attr-match=device=0x0084",
        "udevadm settle --timeout=60",
        f"docker image inspect {TCPXO_RXDM}",
        "systemctl is-enabled --quiet gpuinfra-rxdm.service",
        "systemctl start gpuinfra-rxdm.service",
    ]


def test_a3_mega_fails_loudly(node):
    n = node("a3-megagpu-8g", probe="/var/lib/tcpxo/lib64/nccl-env-profile.sh")
    result, _ = n.run(STUB_NO_APERTURE="1")
    line = one_line_error(result, 7)
    assert line == (
        "gpuinfra-fabric-host (tcpxo): no aperture devices under /dev/aperture_devices (PCI 1ae0:0084); "
        "is this an a3-megagpu-8g?"
    )
    result, _ = n.run(STUB_DOCKER_RUN_RC="125")
    line = one_line_error(result, 7)
    assert line.startswith('gpuinfra-fabric-host (tcpxo): step "NCCL plugin installer" failed (exit 125')
    assert one_line_error(n.run("--reboot")[0], 2) == (
        "gpuinfra-fabric-host (tcpxo): unknown argument '--reboot' (allowed: none, --bake, --wait-rxdm)"
    )


def test_a3_mega_rxdm_wait(node):
    n = node("a3-megagpu-8g")
    result, calls = n.run("--wait-rxdm")
    assert (result.returncode, calls) == (0, ["docker logs gpuinfra-rxdm"])


# --- A3 High -------------------------------------------------------------------------------------


def test_a3_high_refuses_a_kernel_without_tcpx(node):
    n = node("a3-highgpu-8g", probe="/var/lib/tcpx/lib64/libnccl-net.so")
    result, calls = n.run()
    line = one_line_error(result, 6)
    assert line.startswith(
        f"gpuinfra-fabric-host (tcpx): GPUDirect-TCPX needs the linux-gcp-tcpx kernel; this node runs {KERNEL}"
    )
    assert calls == ["uname -r", "uname -r"]
    result, _ = n.run("--bake")
    assert "no /boot/vmlinuz-*tcpx*" in one_line_error(result, 6)


def test_a3_high_on_a_tcpx_kernel(node):
    n = node("a3-highgpu-8g", probe="/var/lib/tcpx/lib64/libnccl-net.so")
    n.path("/boot").mkdir()
    n.path("/boot/vmlinuz-6.5.0-1030-gcp-tcpx").write_text("")
    result, calls = n.run("--bake")
    install = [
        "gcloud auth configure-docker us-docker.pkg.dev --quiet",
        f"docker run --rm --name gpuinfra-nccl-installer --network=host -v /var/lib:/var/lib {TCPX_INSTALLER} install",
        f"docker image inspect {TCPX_RXDM}",
        f"docker pull -q {TCPX_RXDM}",
        "systemctl daemon-reload",
        "systemctl is-enabled --quiet gpuinfra-rxdm.service",
        "systemctl enable --quiet gpuinfra-rxdm.service",
    ]
    assert (result.returncode, calls) == (0, install)
    assert n.path(UNIT_PATH).read_text() == stack("a3-highgpu-8g").writes[UNIT_PATH]
    result, calls = n.run(kernel="6.5.0-1030-gcp-tcpx")
    assert result.returncode == 0, result.stderr
    assert calls == [
        "uname -r",
        f"docker image inspect {TCPX_RXDM}",
        "systemctl is-enabled --quiet gpuinfra-rxdm.service",
        "systemctl start gpuinfra-rxdm.service",
    ]


# --- A3 Ultra / A4 -------------------------------------------------------------------------------

GIB_FRESH = [
    "dpkg-query -W -f=${Version} nccl-gib",
    "curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg",
    "gpg --dearmor --yes -o ROOT/etc/apt/keyrings/gpuinfra-google-cloud.gpg",
    "apt-get update -q",
    "apt-get install -y -q apt-transport-artifact-registry ibverbs-utils",
    "curl -fsSL https://us-apt.pkg.dev/doc/repo-signing-key.gpg",
    "gpg --dearmor --yes -o ROOT/etc/apt/keyrings/gpuinfra-artifact-registry.gpg",
    "apt-get update -q",
    "apt-get install -y -q --allow-change-held-packages nccl-gib=1.1.0",
    "apt-mark hold nccl-gib",
]


@pytest.mark.parametrize("machine_type", ["a3-ultragpu-8g", "a4-highgpu-8g"])
def test_gib_fresh_boot_then_next_boot(node, machine_type):
    n = node(machine_type)
    for i in range(8):
        n.path(f"/dev/infiniband/uverbs{i}").parent.mkdir(parents=True, exist_ok=True)
        n.path(f"/dev/infiniband/uverbs{i}").write_text("")
    result, calls = n.run()
    assert (result.returncode, calls) == (0, GIB_FRESH), result.stderr
    assert n.path("/etc/apt/sources.list.d/gpuinfra-gpudirect-gib.list").read_text() == (
        "deb [signed-by=/etc/apt/keyrings/gpuinfra-artifact-registry.gpg] "
        "ar+https://us-apt.pkg.dev/projects/gce-ai-infra gpudirect-gib-apt main\n"
    )
    f = facts(machine_type)
    for need in gcp_fabric("gib", f, nccl_env("gib")).requirements:
        assert n.path(need.target).exists(), need
    result, calls = n.run()
    assert (result.returncode, calls) == (0, ["dpkg-query -W -f=${Version} nccl-gib"])


def test_gib_without_rdma_devices_fails(node):
    n = node("a4-highgpu-8g")
    result, _ = n.run(GPUINFRA_RDMA_WAIT_SECONDS="0")
    assert one_line_error(result, 6) == (
        "gpuinfra-fabric-host (gib): /dev/infiniband/uverbs0 is missing: the MRDMA NICs have no verbs device "
        "(ibv_devices); the image needs the mlx5_ib driver"
    )
    # --bake installs without devices
    result, calls = n.run("--bake")
    assert (result.returncode, calls) == (0, ["dpkg-query -W -f=${Version} nccl-gib"])
