"""The scratch script run for real (bash) against a fake /dev, /sys and /proc and recording
stand-ins for mdadm, blkid, mkfs.ext4, mount and mountpoint: fresh boot, reboot with the array
already assembled by udev, duplicate by-id links, disks in use, no mdadm, no local NVMe."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuinfra.plan.units import SCRATCH_FAILED_PATH
from gpuinfra.templating import render

TOOLS = [
    "bash",
    "find",
    "readlink",
    "sort",
    "basename",
    "dirname",
    "grep",
    "cut",
    "ls",
    "mkdir",
    "chmod",
    "rm",
    "cat",
    "env",
    "touch",
    "echo",
    "sleep",
    "head",
]
STUB = """#!/bin/bash
echo "$(basename "$0") $*" >> "$STUB_CALLS"
case "$(basename "$0")" in
  mountpoint) grep -qxF "${@: -1}" "$STUB_MOUNTED" ;;
  mdadm)
    if [ "$1" = --assemble ]; then exit 1; fi
    if [ "$1" = --create ]; then touch "$2"; fi ;;
  blkid) [ -n "${STUB_BLKID_OK:-}" ] || exit 2 ;;
esac
"""


class Node:
    """A fake node: ``root`` holds dev/, sys/, proc/, run/; ``bin`` the stand-ins."""

    def __init__(
        self, tmp_path: Path, stubs=("mountpoint", "mdadm", "blkid", "mkfs.ext4", "mount", "logger", "systemctl")
    ):
        self.root = tmp_path / "root"
        self.bin = tmp_path / "bin"
        self.calls = tmp_path / "calls.log"
        self.mounted = tmp_path / "mounted"
        self.mount_point = tmp_path / "scratch"
        for folder in ("dev/disk/by-id", "proc", "run"):
            (self.root / folder).mkdir(parents=True)
        (self.root / "proc" / "mounts").write_text("")
        self.bin.mkdir()
        self.calls.write_text("")
        self.mounted.write_text("")
        for tool in TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool))
        for name in stubs:
            (self.bin / name).write_text(STUB)
            (self.bin / name).chmod(0o755)

    def disk(self, dev: str, *links: str, holder: str | None = None) -> str:
        device = self.root / "dev" / dev
        device.write_text("")
        (self.root / "sys" / "class" / "block" / dev / "holders").mkdir(parents=True)
        if holder:
            (self.root / "sys" / "class" / "block" / dev / "holders" / holder).write_text("")
        for link in links:
            (self.root / "dev" / "disk" / "by-id" / link).symlink_to(device)
        return str(device)

    def run(
        self, existing_mount: str = "", expected: int | None = None, docker_on_scratch: bool = True, **env_extra: str
    ) -> subprocess.CompletedProcess:
        glob = "*NVMe_Instance_Storage*"
        expected = len(list((self.root / "sys" / "class" / "block").glob("*"))) if expected is None else expected
        script = render(
            "scratch-raid0.sh.j2",
            mount_point=str(self.mount_point),
            device_glob=glob,
            existing_mount=existing_mount,
            expected_disks=expected,
            device_wait_seconds=1,
            failed_file=SCRATCH_FAILED_PATH,
            docker_on_scratch=docker_on_scratch,
        )
        path = self.root.parent / "scratch.sh"
        path.write_text(script)
        env = {
            "PATH": str(self.bin),
            "GPUINFRA_SCRATCH_SYSROOT": str(self.root),
            "STUB_CALLS": str(self.calls),
            "STUB_MOUNTED": str(self.mounted),
            "HOME": str(self.root),
            **env_extra,
        }
        return subprocess.run([str(self.bin / "bash"), str(path)], env=env, capture_output=True, text=True, timeout=60)

    def called(self, tool: str) -> list[str]:
        return [line for line in self.calls.read_text().splitlines() if line.split(" ", 1)[0] == tool]


@pytest.fixture
def node(tmp_path):
    if os.name != "posix":
        pytest.skip("bash only")
    return Node(tmp_path)


def test_fresh_boot_builds_one_array_from_each_disk_once(node):
    # two by-id names per disk, as EC2 gives instance-store NVMe (namespace and _1 links)
    disks = [
        node.disk(
            f"nvme{i}n1",
            f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{i}",
            f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{i}_1",
        )
        for i in (1, 2, 3, 4)
    ]
    result = node.run()
    assert result.returncode == 0, result.stdout + result.stderr
    md = f"{node.root}/dev/md/gpuinfra-scratch"
    assert node.called("mdadm") == [
        f"mdadm --assemble {md} {' '.join(disks)}",
        f"mdadm --create {md} --name=gpuinfra-scratch --homehost=any --level=0 --raid-devices=4 --run {' '.join(disks)}",
    ]
    assert node.called("mkfs.ext4") == [f"mkfs.ext4 -F -m 0 -E lazy_itable_init=1,lazy_journal_init=1 {md}"]
    assert node.called("mount") == [f"mount -o defaults,noatime {md} {node.mount_point}"]
    assert stat.S_IMODE(node.mount_point.stat().st_mode) == 0o1777


def test_reboot_reuses_the_array_udev_assembled(node):
    for i in (1, 2):
        node.disk(f"nvme{i}n1", f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{i}", holder="md127")
    result = node.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.called("mdadm") == [] and node.called("mkfs.ext4") == [
        f"mkfs.ext4 -F -m 0 -E lazy_itable_init=1,lazy_journal_init=1 {node.root}/dev/md127"
    ]
    assert node.called("mount") == [f"mount -o defaults,noatime {node.root}/dev/md127 {node.mount_point}"]
    assert "reusing array md127 of 2 disk(s)" in result.stdout


@pytest.mark.parametrize("case", ["mounted-elsewhere", "held-by-lvm", "split-arrays"])
def test_nvme_that_cannot_be_used_fails_loudly_instead_of_using_the_root_disk(node, case):
    first = node.disk(
        "nvme1n1",
        "nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1",
        holder={"held-by-lvm": "dm-0", "split-arrays": "md126"}.get(case),
    )
    node.disk(
        "nvme2n1", "nvme-Amazon_EC2_NVMe_Instance_Storage_AWS2", holder="md127" if case == "split-arrays" else None
    )
    if case == "mounted-elsewhere":
        (node.root / "proc" / "mounts").write_text(f"{first} /mnt/data ext4 rw 0 0\n")
    result = node.run()
    assert result.returncode == 1
    reason = (node.root / "run" / "gpuinfra" / "scratch-failed").read_text().strip()
    assert {
        "mounted-elsewhere": f"{first} is mounted elsewhere (/mnt/data)",
        "held-by-lvm": f"{first} is in use by dm-0",
        "split-arrays": "the local NVMe disks belong to different arrays (md126, md127)",
    }[case] in reason
    assert f"ERROR: {reason}" in result.stdout
    assert node.called("mkfs.ext4") == []
    # chmod does not stop root: a read-only tmpfs covers the mount point instead
    assert node.called("mount") == [
        f"mount -t tmpfs -o ro,size=4k,mode=0555 gpuinfra-scratch-failed {node.mount_point}"
    ]


def test_mdadm_missing_and_not_installable_fails_loudly(tmp_path):
    node = Node(tmp_path, stubs=("mountpoint", "blkid", "mkfs.ext4", "mount", "logger", "systemctl"))
    for i in (1, 2):
        node.disk(f"nvme{i}n1", f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{i}")
    result = node.run()
    assert result.returncode == 1
    assert (
        "mdadm is missing and could not be installed" in (node.root / "run" / "gpuinfra" / "scratch-failed").read_text()
    )


def test_a_machine_without_local_nvme_gets_a_folder(node):
    result = node.run(expected=0)
    assert result.returncode == 0 and node.mount_point.is_dir()
    assert node.called("mdadm") == [] and node.called("mount") == []
    assert "this machine has no local NVMe" in result.stdout


@pytest.mark.parametrize("present", [0, 2])
def test_missing_disks_fail_instead_of_a_partial_array_or_the_root_disk(node, present):
    for i in range(1, present + 1):
        node.disk(f"nvme{i}n1", f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{i}")
    result = node.run(expected=4)
    assert result.returncode == 1 and node.called("mdadm") == [] and node.called("mkfs.ext4") == []
    assert (
        (node.root / "run" / "gpuinfra" / "scratch-failed")
        .read_text()
        .startswith(f"found {present} of the 4 local NVMe disks (*NVMe_Instance_Storage*) after 1 s")
    )


def test_a_reboot_keeps_the_data_on_an_existing_filesystem(node):
    for i in (1, 2):
        node.disk(f"nvme{i}n1", f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{i}", holder="md127")
    result = node.run(STUB_BLKID_OK="1")
    assert result.returncode == 0 and node.called("mkfs.ext4") == [] and node.called("mdadm") == []
    assert node.called("mount") == [f"mount -o defaults,noatime {node.root}/dev/md127 {node.mount_point}"]


@pytest.mark.parametrize("mounted", [True, False])
def test_the_dlamis_own_lvm_volume_is_waited_for_and_reused(node, mounted):
    # the DLAMI's dlami-nvme.service puts the instance store in an LVM volume (disk held by dm-0)
    node.disk("nvme1n1", "nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1", holder="dm-0")
    node.mounted.write_text("/opt/dlami/nvme\n" if mounted else "")
    result = node.run(existing_mount="/opt/dlami/nvme")
    if mounted:  # already mounted when the unit runs
        assert result.returncode == 0 and node.called("mount") == [f"mount --bind /opt/dlami/nvme {node.mount_point}"]
    else:
        assert result.returncode == 1 and "and /opt/dlami/nvme was not mounted after 1 s" in result.stdout


def test_the_dlami_nvme_mount_is_reused(node):
    node.disk("nvme1n1", "nvme-Amazon_EC2_NVMe_Instance_Storage_AWS1", holder="md0")
    node.mounted.write_text("/opt/dlami/nvme\n")
    result = node.run(existing_mount="/opt/dlami/nvme")
    assert result.returncode == 0, result.stdout + result.stderr
    assert node.called("mount") == [f"mount --bind /opt/dlami/nvme {node.mount_point}"] and node.called("mdadm") == []


@pytest.mark.parametrize("baked", [False, True])
def test_dockers_image_store_moves_to_scratch_unless_the_image_is_baked(tmp_path, baked):
    # a baked image keeps its container under Docker's default data-root on the root disk; a
    # data-root on the (empty) scratch would hide it and every node would pull it again
    node = Node(tmp_path)
    (node.bin / "python3").symlink_to(os.path.realpath(sys.executable))
    config = node.root / "etc" / "docker" / "daemon.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"default-runtime": "nvidia"}')
    result = node.run(expected=0, docker_on_scratch=not baked)
    assert result.returncode == 0, result.stdout + result.stderr
    if baked:
        assert config.read_text() == '{"default-runtime": "nvidia"}'
        assert "docker data-root left where the bake put it" in result.stdout
    else:
        assert json.loads(config.read_text()) == {
            "default-runtime": "nvidia",
            "data-root": f"{node.mount_point}/docker",
        }
    # the stand-in systemctl says Docker runs: it is restarted onto the new data-root, or left alone
    moved = ["systemctl is-active --quiet docker", "systemctl restart docker"]
    assert node.called("systemctl") == ([] if baked else moved)
