"""A stand-in for the ``aws`` / ``gcloud`` processes the checkpoint sync starts: a
:func:`subprocess.run` replacement over an in-memory bucket, with injectable faults."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


class FakeCli:
    """``run(argv, input=..., timeout=...)`` for ``aws s3 sync|cp`` and ``gcloud storage
    rsync|cp``; ``objects`` is ``"bucket/key" -> bytes``.

    Attributes:
        fail: argv -> True makes that call exit 1.
        during_upload: called with the folder after the first file of each folder upload is
            read (a trainer writing meanwhile).
        seconds_per_call: each call's duration (a call longer than its timeout raises
            :class:`subprocess.TimeoutExpired` after ``timeout``, as subprocess.run does).
        sleep: how time passes (tests pass a fake clock's advance).
    """

    def __init__(self, sleep=time.sleep) -> None:
        self.objects: dict[str, bytes] = {}
        self.calls: list[list[str]] = []
        self.fail = lambda argv: False
        self.during_upload = None
        self.seconds_per_call = 0.0
        self.sleep = sleep

    def __call__(self, argv, input=None, capture_output=True, text=True, timeout=None, check=False):
        self.calls.append(list(argv))
        if timeout is not None and self.seconds_per_call > timeout:
            self.sleep(timeout)
            raise subprocess.TimeoutExpired(argv, timeout)
        self.sleep(self.seconds_per_call)
        if self.fail(argv):
            return subprocess.CompletedProcess(argv, 1, "", "injected failure")
        args = [a for a in argv[3:] if not a.startswith("--")]
        src, dst = args
        out = ""
        if argv[1:3] in (["s3", "sync"], ["storage", "rsync"]):
            if "://" in dst:
                base = dst.split("://", 1)[1]
                for i, path in enumerate(sorted(p for p in Path(src).rglob("*") if p.is_file())):
                    self.objects[f"{base}/{path.relative_to(src).as_posix()}"] = path.read_bytes()
                    if i == 0 and self.during_upload:
                        self.during_upload(Path(src))
            else:
                base = src.split("://", 1)[1] + "/"
                for key, body in self.objects.items():
                    if key.startswith(base):
                        target = Path(dst) / key[len(base) :]
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(body)
        elif src == "-":
            self.objects[dst.split("://", 1)[1]] = (input or "").encode()
        else:
            key = src.split("://", 1)[1]
            if key not in self.objects:
                return subprocess.CompletedProcess(argv, 1, "", "404 Not Found")
            out = self.objects[key].decode()
        return subprocess.CompletedProcess(argv, 0, out, "")

    def keys(self, prefix: str = "") -> list[str]:
        """Object names (``bucket/key``) under ``prefix``, sorted."""
        return sorted(k for k in self.objects if k.startswith(prefix))
