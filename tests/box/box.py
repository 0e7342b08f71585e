"""The box: real boot text booted under real systemd, one ``systemd-nspawn`` container per node.

Layout (all names carry a per-box tag, nothing touches the host's own network):

* a box network namespace (``ip netns add``) holding a bridge with 10.77.0.1/24 and
  169.254.169.254/32, and the stand-in cloud (:mod:`tests.box.server`) listening on port 80;
* per node a network namespace joined to the bridge by a veth pair (``eth0``, 10.77.0.1x/24,
  default route via the bridge), plus the scenario's GPU NICs as veth pairs that are up;
* per node an overlayfs of the cached rootfs (its upper folder is the node's disk, kept across
  reboots), provisioned with the stand-ins and the cloud's boot path: a NoCloud seed for cloud-init
  on AWS (docs.cloud-init.io/en/latest/reference/datasources/nocloud.html), a
  ``google-startup-scripts.service`` that fetches ``instance/attributes/startup-script`` and runs
  it with bash on every boot on GCP, as the guest agent does
  (cloud.google.com/compute/docs/instances/startup-scripts/linux);
* ``systemd-nspawn --boot --register=no --keep-unit --network-namespace-path=...``
  (www.freedesktop.org/software/systemd/man/latest/systemd-nspawn.html): a reboot inside makes
  nspawn exit with status 133 (the status systemd-nspawn@.service restarts on), a power-off with 0.

Every subprocess runs under a timeout; :meth:`Box.close` stops the containers (SIGTERM, which
nspawn turns into an orderly shutdown for ``--boot``, then SIGKILL of the container's init),
unmounts, deletes the namespaces and stops the server, whatever failed before.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.box.render import BootText
from tests.box.scenario import Scenario

HERE = Path(__file__).resolve().parent
BRIDGE_ADDRESS = "10.77.0.1"
METADATA_ADDRESS = "169.254.169.254"
#: nspawn's exit status when the container rebooted (systemd-nspawn@.service: RestartForceExitStatus=133).
EXIT_REBOOT = 133
STANDIN_PROGRAMS = {
    "/usr/local/bin/aws": "aws",
    "/usr/local/bin/gcloud": "gcloud",
    "/usr/bin/docker": "docker",  # where the node images have it (the units name /usr/bin/docker)
    "/usr/local/bin/nvidia-smi": "nvidia-smi",
    "/usr/local/bin/fi_info": "fi_info",
    "/usr/local/sbin/shutdown": "shutdown",
}
#: Stand-in units for what the GPU images ship: Docker, the NVIDIA fabric manager. Daemons are
#: daemons here too (``sleep infinity``): a finished oneshot was seen reported "failed" on a
#: cgroup v1 host ("Failed to kill control group ... Input/output error").
STANDIN_UNITS = {
    "docker.service": "[Unit]\nDescription=box stand-in for Docker\n[Service]\nExecStart=/bin/sleep infinity\n"
    "[Install]\nWantedBy=multi-user.target\n",
    # nspawn mounts /sys before it joins the node's network namespace, so /sys/class/net lists the
    # host's interfaces; this remounts the two per-namespace folders from a sysfs mounted inside
    # (sysfs(5): network devices are shown for the mounting process's network namespace)
    "box-sysfs-net.service": "[Unit]\nDescription=box: /sys/class/net of this node's network namespace\n"
    "DefaultDependencies=no\nBefore=sysinit.target\n[Service]\nType=oneshot\n"
    "RemainAfterExit=yes\nExecStart=/bin/sh -c 'mkdir -p /run/box-sysfs && mount -t sysfs "
    "-o ro sysfs /run/box-sysfs && mount --bind /run/box-sysfs/class/net /sys/class/net && "
    "mount --bind /run/box-sysfs/devices/virtual/net /sys/devices/virtual/net'\n"
    "[Install]\nWantedBy=sysinit.target\n",
    # a daemon, as the real one is: active from its start until the node stops
    "nvidia-fabricmanager.service": "[Unit]\nDescription=box stand-in for the NVIDIA fabric manager\n"
    "DefaultDependencies=no\nBefore=basic.target\n[Service]\n"
    "ExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
}
#: GCP: what the guest agent's google-startup-scripts.service does on every boot: its runner
#: (``google_metadata_script_runner startup``) fetches the ``startup-script`` attribute and runs it
#: (cloud.google.com/compute/docs/instances/startup-scripts/linux). The unit below copies the
#: guest agent's own unit file (GoogleCloudPlatform/guest-agent google-startup-scripts.service)
#: with this runner in place of the agent's binary.
STARTUP_RUNNER = """#!/bin/bash
set -u
SCRIPT="$(mktemp /tmp/startup-script.XXXXXX)"
curl -sSf -H 'Metadata-Flavor: Google' \\
  http://metadata.google.internal/computeMetadata/v1/instance/attributes/startup-script > "$SCRIPT" || exit 1
echo "startup-script: running"
rc=0
/bin/bash "$SCRIPT" || rc=$?
echo "startup-script exit status $rc"
rm -f "$SCRIPT"
"""
STARTUP_UNIT = """[Unit]
Description=Google Compute Engine Startup Scripts (box stand-in for the guest agent's runner)
Wants=network-online.target
After=network-online.target
Before=apt-daily.service
[Service]
Type=oneshot
ExecStart=/usr/local/lib/box/metadata-script-runner
KillMode=process
StandardOutput=journal+console
StandardError=journal+console
[Install]
WantedBy=multi-user.target
"""
#: GCP A3 Mega: the TCPXO host stack needs a kernel module and the RxDM container, which a
#: container cannot have; this unit takes the bundle's unit name (``/etc/systemd/system.control``
#: is searched before ``/etc/systemd/system``, systemd.unit(5)) and leaves what the stack leaves.
TCPXO_STANDIN = {
    "gpuinfra-fabric-host.service": "[Unit]\nDescription=box stand-in for the TCPXO host stack\n[Service]\n"
    "Type=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sh -c 'install -d "
    "/var/lib/tcpxo/lib64 /dev/aperture_devices && : > "
    "/var/lib/tcpxo/lib64/nccl-env-profile.sh && : > /dev/aperture_devices/0000:00:00.0"
    " && systemctl start gpuinfra-rxdm.service'\n[Install]\nWantedBy=multi-user.target\n",
    "gpuinfra-rxdm.service": "[Unit]\nDescription=box stand-in for RxDM\n[Service]\nExecStart=/bin/sleep infinity\n",
}
COMMAND_TIMEOUT_SECONDS = 60


def run(argv: list[str], timeout: float = COMMAND_TIMEOUT_SECONDS, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``argv`` (no shell) with a timeout, capturing text output.

    Raises:
        subprocess.CalledProcessError: non-zero exit with ``check``; subprocess.TimeoutExpired.
    """
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check)


class Node:
    """One node: its namespace, disk (overlay upper), container process and identity."""

    def __init__(self, box: Box, index: int) -> None:
        self.box, self.index = box, index
        self.ip = f"10.77.0.{11 + index}"
        self.netns = f"{box.tag}-n{index}"
        self.dir = box.workdir / f"node{index}"
        self.merged = self.dir / "merged"
        if box.boot.cloud == "aws":
            self.name = self.id = f"i-0b0x{box.tag[-6:]}{index:07d}"
        elif box.scenario.gcp_bulk and index < len(box.boot.bulk_names):
            self.name = box.boot.bulk_names[index]  # a VM of the stack's bulk insert
            self.id = str(4000000000000000000 + index)
        else:
            self.name = f"{box.boot.group}-b{index}x{box.tag[-3:]}"
            self.id = str(4000000000000000000 + index)
        #: GCP: a member of the managed instance group (``created-by`` set, listed by the group)
        self.mig = box.boot.cloud == "gcp" and not (box.scenario.gcp_bulk and index < len(box.boot.bulk_names))
        self.proc: subprocess.Popen | None = None
        self.console = self.dir / "console.log"
        self.boots = 0

    # ------------------------------------------------------------------ disk
    def mount(self) -> None:
        """Overlay the cached rootfs (lower, read-only) with this node's disk (upper)."""
        for sub in ("upper", "work", "merged"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={self.box.rootfs},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}",
                str(self.merged),
            ]
        )

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write ``text`` at the container path ``path`` on the node's disk."""
        target = self.merged / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)

    def enable(self, unit: str, root: str = "/etc/systemd/system", target: str = "multi-user.target") -> None:
        """``systemctl enable`` by hand: the ``<target>.wants`` link."""
        link = self.merged / f"etc/systemd/system/{target}.wants" / unit
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(f"{root}/{unit}")

    def provision(self) -> None:
        """The stand-ins, identity files and the cloud's boot path (see the module docstring)."""
        self.write("/etc/machine-id", secrets.token_hex(16) + "\n", 0o444)
        self.write("/etc/hostname", self.name + "\n")
        self.write(
            "/etc/hosts",
            f"127.0.0.1 localhost\n{self.ip} {self.name}\n{METADATA_ADDRESS} metadata.google.internal metadata\n"
            # every node's name, as the clouds' VPC DNS resolves them (torchrun's elastic agent
            # hands its workers the rank-0 node's host name as MASTER_ADDR)
            + "".join(f"{n.ip} {n.name}\n" for n in self.box.nodes if n is not self),
        )
        # torchrun for the training job (tests/box/jobs/): Debian's, with the box's one fix
        self.write("/usr/local/bin/torchrun", (HERE / "jobs" / "torchrun_box.py").read_text(), 0o755)
        self.write("/usr/local/lib/box/standin.py", (HERE / "standin.py").read_text(), 0o755)
        for path in STANDIN_PROGRAMS:
            link = self.merged / path.lstrip("/")
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)
            link.symlink_to("/usr/local/lib/box/standin.py")
        for unit, text in STANDIN_UNITS.items():
            self.write(f"/etc/systemd/system/{unit}", text)
            self.enable(unit, target="sysinit.target" if unit.startswith("box-") else "multi-user.target")
        devices = self.box.efa_devices
        if devices:
            self.write(
                "/etc/tmpfiles.d/box-efa.conf",
                "d /dev/infiniband 0755 root root -\n"
                + "".join(f"f /dev/infiniband/uverbs{n} 0600 root root -\n" for n in range(devices)),
            )
        if self.box.boot.cloud == "aws":
            self.write(
                "/var/lib/cloud/seed/nocloud/meta-data", f"instance-id: {self.id}\nlocal-hostname: {self.name}\n"
            )
            self.write("/var/lib/cloud/seed/nocloud/user-data", self.box.boot_text)
            self.write(
                "/etc/cloud/cloud.cfg.d/99-box.cfg",
                "datasource_list: [NoCloud]\nnetwork: {config: disabled}\nlocale: C.UTF-8\n",
            )
        else:
            self.write("/etc/cloud/cloud-init.disabled", "")
            self.write("/usr/local/lib/box/metadata-script-runner", STARTUP_RUNNER, 0o755)
            self.write("/etc/systemd/system/google-startup-scripts.service", STARTUP_UNIT)
            self.enable("google-startup-scripts.service")
            for unit, text in TCPXO_STANDIN.items():
                self.write(f"/etc/systemd/system.control/{unit}", text)

    # ------------------------------------------------------------------ network
    def plumb(self) -> None:
        """This node's namespace: eth0 on the box bridge, the scenario's GPU NICs."""
        box, ns = self.box, self.netns
        run(["ip", "netns", "add", ns])
        box.netns_made.append(ns)
        run(
            [
                "ip",
                "-n",
                box.netns,
                "link",
                "add",
                f"v{self.index}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            ]
        )
        run(["ip", "-n", box.netns, "link", "set", f"v{self.index}", "master", "br0", "up"])
        for argv in (
            ["link", "set", "lo", "up"],
            ["addr", "add", f"{self.ip}/24", "dev", "eth0"],
            ["link", "set", "eth0", "up"],
            ["route", "add", "default", "via", BRIDGE_ADDRESS],
        ):
            run(["ip", "-n", ns, *argv])
        for n, nic in enumerate(box.scenario.gpu_nics):
            run(["ip", "-n", ns, "link", "add", nic, "type", "veth", "peer", "name", f"gp{n}"])
            run(["ip", "-n", ns, "addr", "add", f"10.{80 + n}.0.{11 + self.index}/24", "dev", nic])
            run(["ip", "-n", ns, "link", "set", f"gp{n}", "up"])
            run(["ip", "-n", ns, "link", "set", nic, "up"])

    # ------------------------------------------------------------------ container
    def start(self) -> None:
        """Boot the container (returns at once; :meth:`wait_exit` collects it)."""
        self.boots += 1
        argv = [
            "systemd-nspawn",
            "--quiet",
            "-D",
            str(self.merged),
            "--boot",
            "--register=no",
            "--keep-unit",
            f"--network-namespace-path=/run/netns/{self.netns}",
            f"--machine={self.name[:60]}",
            "--console=pipe",
            "--link-journal=no",
        ]
        with open(self.console, "a") as log:
            log.write(f"===== box: boot {self.boots}: {shlex.join(argv)}\n")
            log.flush()
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def running(self) -> bool:
        """The container process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int:
        """The nspawn exit status (0 power-off, :data:`EXIT_REBOOT` reboot).

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.
        """
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def init_pid(self) -> int | None:
        """The host pid of the container's init: the child of this node's nspawn whose pid in
        its own pid namespace is 1 (``NSpid`` in proc(5)), or None."""
        if not self.running():
            return None
        assert self.proc is not None
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return None
        for child in children:
            try:
                status = Path(f"/proc/{child}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                fields = line.split()
                if fields[:1] == ["NSpid:"] and len(fields) > 2 and fields[-1] == "1":
                    return int(child)
        return None

    def read(self, path: str) -> str | None:
        """A file inside the running container (``/run`` included), None when absent."""
        pid = self.init_pid()
        try:
            return Path(f"/proc/{pid}/root{path}").read_text() if pid else None
        except OSError:
            return None

    def exec(self, argv: list[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the container (its mount, pid, uts, ipc and network namespaces).

        Raises:
            RuntimeError: the container is not running; subprocess errors as :func:`run`.
        """
        pid = self.init_pid()
        if pid is None:
            raise RuntimeError(f"{self.name} is not running")
        return run(["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "--", *argv], timeout, check)

    def kernel_message(self, text: str) -> None:
        """Append ``text`` as one record (``prio,seq,usec,flags;message``, kernel.org
        Documentation/ABI/testing/dev-kmsg) to the node's ``/dev/kmsg``: a regular file here,
        since systemd-nspawn gives a container no ``/dev/kmsg`` of its own.

        Raises:
            RuntimeError: the container is not running.
        """
        self.exec(["/bin/sh", "-c", 'printf "3,%s,%s,-;%s\\n" 900 123456789 "$1" >> /dev/kmsg', "sh", text])

    def stop(self) -> None:
        """Stop the container: SIGTERM (an orderly power-off), then SIGKILL of nspawn and init."""
        if not self.running():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
            return
        except subprocess.TimeoutExpired:
            pass
        pid = self.init_pid()
        if pid:
            os.kill(pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(timeout=20)

    def diagnostics(self) -> str:
        """The console's tail and, when running, the gpuinfra units' journal (for failure messages)."""
        text = self.console.read_text(errors="replace")[-3000:] if self.console.exists() else ""
        if self.running():
            try:
                text += self.exec(
                    [
                        "journalctl",
                        "--no-pager",
                        "-o",
                        "cat",
                        "-n",
                        "80",
                        "-u",
                        "gpuinfra-*",
                        "-u",
                        "cloud-final",
                        "-u",
                        "google-startup-scripts",
                    ],
                    check=False,
                ).stdout
                run_check = self.exec(
                    ["/usr/local/bin/gpuinfra-run", "--skip-health-gate", "--dry-run", "--wait", "1", "--", "true"],
                    check=False,
                )
                text += f"\ngpuinfra-run --dry-run now: exit {run_check.returncode}: {run_check.stderr[-1500:]}"
            except (RuntimeError, subprocess.SubprocessError) as exc:
                text += f"\n(no journal: {exc!r})"
        return f"----- {self.name} ({self.ip})\n{text}"


class Box:
    """A set of nodes booting ``boot`` under ``scenario`` (use as a context manager).

    Args:
        rootfs: the cached tree (:func:`tests.box.rootfs.ensure_rootfs`).
        scenario: what the stand-ins answer.
        boot: the rendered boot text and bundle (:func:`tests.box.render.render_boot`).
        nodes: how many nodes.
        bucket: the stack bucket name the boot text was rendered for.
        region, zone: the AWS region / GCP zone the metadata stand-in reports.
        efa_devices: how many ``/dev/infiniband/uverbs*`` each node has (AWS EFA).
        workdir: an empty folder for disks, the server's state and logs.
    """

    def __init__(
        self,
        rootfs: Path,
        scenario: Scenario,
        boot: BootText,
        nodes: int,
        bucket: str,
        region: str,
        zone: str,
        efa_devices: int,
        workdir: Path,
    ) -> None:
        self.rootfs, self.scenario, self.boot, self.bucket = rootfs, scenario, boot, bucket
        self.region, self.zone, self.efa_devices, self.workdir = region, zone, efa_devices, workdir
        self.tag = f"gbx{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.netns = f"{self.tag}-box"
        self.netns_made: list[str] = []
        self.state = workdir / "state"
        self.server: subprocess.Popen | None = None
        self.boot_text = scenario.patch(boot.text)
        self.nodes = [Node(self, i) for i in range(nodes)]

    def __enter__(self) -> Box:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        """Network, server, disks; nothing boots yet (:meth:`start`)."""
        attributes = {"startup-script": self.boot_text} if self.boot.cloud == "gcp" else {}
        self.state.mkdir(parents=True)
        (self.state / "scenario.json").write_text(json.dumps(self.scenario.to_json(self.region, self.zone, attributes)))
        self.set_states("running")
        bundle = self.state / "bucket" / self.bucket / self.boot.bundle_key
        bundle.parent.mkdir(parents=True)
        bundle.write_text(self.boot.bundle)
        run(["ip", "netns", "add", self.netns])
        self.netns_made.append(self.netns)
        for argv in (
            ["link", "set", "lo", "up"],
            ["link", "add", "br0", "type", "bridge"],
            ["addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", "br0"],
            ["addr", "add", f"{METADATA_ADDRESS}/32", "dev", "br0"],
            ["link", "set", "br0", "up"],
        ):
            run(["ip", "-n", self.netns, *argv])
        with open(self.workdir / "server.log", "w") as log:  # the server keeps its own copy of the descriptor
            self.server = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, sys.executable, str(HERE / "server.py"), str(self.state)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 20
        while not (self.state / "ready").exists():
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the box server did not start: {(self.workdir / 'server.log').read_text()}")
            time.sleep(0.1)
        for node in self.nodes:
            node.plumb()
            node.mount()
            node.provision()

    def set_states(self, state: str, names: list[str] | None = None) -> None:
        """Set the cloud's view of nodes (``running``, ``terminated``; all when ``names`` is None)."""
        path = self.state / "nodes.json"
        old = {n["name"]: n for n in json.loads(path.read_text())["nodes"]} if path.exists() else {}
        doc = {
            "nodes": [
                {
                    "name": n.name,
                    "id": n.id,
                    "ip": n.ip,
                    "state": state if names is None or n.name in names else old.get(n.name, {}).get("state", state),
                    "notices": old.get(n.name, {}).get("notices", {}),
                    "mig": n.mig,
                }
                for n in self.nodes
            ]
        }
        self._write_nodes(doc)

    def notify(self, node: Node, kind: str, value: object) -> None:
        """Publish a cloud notice for ``node`` from now on: ``spot`` (the IMDS
        ``spot/instance-action`` document, e.g. ``{"action": "terminate", "time": "..."}``),
        ``rebalance`` (``events/recommendations/rebalance``, e.g. ``{"noticeTime": "..."}``) or
        ``preempted`` (GCE ``instance/preempted`` reads ``TRUE``; ``value`` unused)
        (docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html,
        cloud.google.com/compute/docs/instances/create-use-preemptible#detecting_if_an_instance_was_preempted)."""
        path = self.state / "nodes.json"
        doc = json.loads(path.read_text())
        for entry in doc["nodes"]:
            if entry["name"] == node.name:
                entry.setdefault("notices", {})[kind] = value
        self._write_nodes(doc)

    def _write_nodes(self, doc: dict) -> None:
        path = self.state / "nodes.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

    def start(self) -> None:
        """Boot every node."""
        for node in self.nodes:
            node.start()

    def calls(self) -> list[dict]:
        """Every stand-in call so far: ``{"t", "node", "argv", "rc"}``, in order."""
        path = self.state / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_for(self, what: str, condition, timeout: float, poll: float = 1.0):
        """Poll ``condition()`` until it returns something truthy, which is returned.

        Raises:
            AssertionError: ``timeout`` seconds passed (with every node's diagnostics).
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(poll)
        raise AssertionError(
            f"box: {what} not within {timeout:.0f} s\n" + "\n".join(n.diagnostics() for n in self.nodes)
        )

    def close(self) -> None:
        """Stop everything this box started; never raises (a failure is printed)."""
        for step in (
            [n.stop for n in self.nodes]
            + [self._stop_server]
            + [lambda n=n: run(["umount", "-l", str(n.merged)], check=False) for n in self.nodes]
            + [lambda ns=ns: run(["ip", "netns", "delete", ns], check=False) for ns in self.netns_made]
        ):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - teardown goes on
                print(f"box teardown: {exc!r}", file=sys.stderr)
        self.netns_made.clear()

    def _stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(timeout=10)

    def remove_disks(self) -> None:
        """Delete the nodes' disks (after :meth:`close`)."""
        for node in self.nodes:
            shutil.rmtree(node.dir, ignore_errors=True)
