"""The box tier's root file system: Debian bookworm from ``debootstrap``, built once and cached.

The cache key hashes the package list, the suite, the mirror and :data:`TIER_VERSION`; a build
goes to a temporary folder next to the cache entry and is renamed into place, under an exclusive
``flock`` so two runs never build at once (debootstrap(8), flock(2)).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

#: Bump when what the tier installs into the cached tree changes in a way the key does not see.
TIER_VERSION = "1"
SUITE = "bookworm"
#: Where apt on this machine gets Debian's packages (deb822 ``*.sources`` files, sources.list(5)).
APT_SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))


def host_mirror() -> str:
    """The Debian archive this machine's apt is set up with (``GPUINFRA_BOX_MIRROR`` overrides):
    the first ``URIs:`` of a deb822 source whose suites include :data:`SUITE`, else the first
    ``deb URI SUITE ...`` line of ``/etc/apt/sources.list`` (sources.list(5)). The tier uses the
    machine's own package source and names none.

    Raises:
        RuntimeError: no apt source for :data:`SUITE` (set ``GPUINFRA_BOX_MIRROR``).
    """
    if os.environ.get("GPUINFRA_BOX_MIRROR"):
        return os.environ["GPUINFRA_BOX_MIRROR"]
    folder, listing = APT_SOURCES
    for path in sorted(folder.glob("*.sources")) if folder.is_dir() else []:
        for stanza in path.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith("#")
            )
            if SUITE in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
                return fields["URIs"].split()[0]
    lines = listing.read_text().splitlines() if listing.is_file() else []
    for words in (line.split() for line in lines):
        if len(words) >= 3 and words[0] == "deb" and SUITE in words[2:]:
            return next(w for w in words[1:] if not w.startswith("["))
    raise RuntimeError(f"no apt source for Debian {SUITE} on this machine: set GPUINFRA_BOX_MIRROR")


#: What the node software needs besides gpuinfra's own files: systemd as init, cloud-init (AWS
#: user data), curl (IMDS and metadata reads), iproute2 (the GCP NIC wait), mdadm/e2fsprogs (the
#: scratch script), python3 (agent, health gate, bundle installer); python3-cffi-backend is named
#: because debootstrap does not resolve the virtual package cloud-init needs through python3-cryptography.
#: python3-torch: Debian's CPU build of PyTorch 1.13.1 (torch.distributed.run, gloo) for the box's
#: training job (``tests/box/jobs/train_tiny.py``), without the CUDA libraries PyPI's wheel pulls.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "cloud-init",
    "curl",
    "iproute2",
    "mdadm",
    "e2fsprogs",
    "ca-certificates",
    "python3-cffi-backend",
    "python3-torch",
)
BUILD_TIMEOUT_SECONDS = 900
LOCK_TIMEOUT_SECONDS = 1200
#: The cache root, resolved once at import: tests/conftest.py points HOME and XDG_* at a temporary
#: folder for every test, which must not move the cache.
CACHE_ROOT = Path(os.environ.get("GPUINFRA_BOX_CACHE") or "/var/cache/gpuinfra-box")


def cache_key() -> str:
    """Hex digest (16 characters) of everything the cached tree is built from."""
    text = "\n".join((TIER_VERSION, SUITE, host_mirror(), *sorted(PACKAGES)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def rootfs_path(root: Path = CACHE_ROOT) -> Path:
    """Where the tree for :func:`cache_key` lives (it may not exist yet)."""
    return root / f"rootfs-{SUITE}-{cache_key()}"


def ensure_rootfs(root: Path = CACHE_ROOT) -> tuple[Path, float | None]:
    """The cached tree, built first when missing.

    Returns:
        (path, build seconds), the seconds None when the cache already had it.

    Raises:
        subprocess.CalledProcessError / subprocess.TimeoutExpired: debootstrap failed or took
            longer than :data:`BUILD_TIMEOUT_SECONDS`.
        TimeoutError: another run held the build lock for :data:`LOCK_TIMEOUT_SECONDS`.
    """
    target = rootfs_path(root)
    if (target / "etc" / "os-release").exists():
        return target, None
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        deadline = time.monotonic() + LOCK_TIMEOUT_SECONDS
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{root / '.build.lock'} held for {LOCK_TIMEOUT_SECONDS} s") from None
                time.sleep(2)
        if (target / "etc" / "os-release").exists():  # built by the run that held the lock
            return target, None
        started = time.monotonic()
        tmp = root / f".build-{target.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), host_mirror()],
                check=True,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_SECONDS,
            )
            _trim(tmp)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target, time.monotonic() - started


def _trim(tree: Path) -> None:
    """Drop the apt cache and make the tree boot the same way every time: no machine id (each
    node gets its own), no units that expect real hardware or a console."""
    shutil.rmtree(tree / "var" / "cache" / "apt" / "archives", ignore_errors=True)
    (tree / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (tree / "etc" / "machine-id").write_text("")
    for unit in (
        "mdmonitor.service",
        "mdcheck_start.timer",
        "mdcheck_continue.timer",
        "mdmonitor-oneshot.timer",
        "e2scrub_all.timer",
        "e2scrub_reap.service",
    ):
        (tree / "etc" / "systemd" / "system" / unit).unlink(missing_ok=True)
        link = tree / "etc" / "systemd" / "system" / unit
        link.symlink_to("/dev/null")
