#!/usr/bin/python3
"""A stand-in executable inside a box node: ``aws``, ``gcloud``, ``docker``, ``nvidia-smi``,
``fi_info`` and ``shutdown`` are links to this file.

It sends its argv, its stdin (when the call reads ``-``) and the local files its arguments name
to the box server (``POST http://169.254.169.254/box/cli``, :mod:`tests.box.server`), which
records the call and answers from the scenario; it then prints the answer, writes the files the
answer carries (downloads) and exits with its code. Standard library only: it runs under the
node's python3.
"""

import base64
import json
import os
import subprocess
import sys
import urllib.request

URL = "http://169.254.169.254/box/cli"
MAX_FILE_BYTES = 8 * 1024 * 1024


def main() -> int:
    """Forward this call to the box server and act out its answer; the answer's exit code
    (255 when the server cannot be reached)."""
    argv = [os.path.basename(sys.argv[0])] + sys.argv[1:]
    files = {}
    for arg in sys.argv[1:]:
        if os.path.isfile(arg) and os.path.getsize(arg) <= MAX_FILE_BYTES:
            with open(arg, "rb") as f:
                files[arg] = base64.b64encode(f.read()).decode()
        elif os.path.isdir(arg) and sys.argv[1:3] in (["s3", "sync"], ["storage", "rsync"]):
            # an upload's source folder (aws s3 sync / gcloud storage rsync): every file under it
            for folder, _, names in os.walk(arg):
                for name in names:
                    path = os.path.join(folder, name)
                    if os.path.isfile(path) and os.path.getsize(path) <= MAX_FILE_BYTES:
                        with open(path, "rb") as f:
                            files[path] = base64.b64encode(f.read()).decode()
    stdin = sys.stdin.buffer.read() if "-" in sys.argv[1:] and not sys.stdin.isatty() else b""
    request = {"argv": argv, "files": files, "stdin": base64.b64encode(stdin).decode()}
    if argv[0] == "docker":  # which image store answers: the data-root in daemon.json
        try:
            with open("/etc/docker/daemon.json") as f:
                request["docker_root"] = json.load(f).get("data-root", "")
        except (OSError, ValueError):
            pass
    body = json.dumps(request).encode()
    request = urllib.request.Request(URL, body, {"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    except OSError as exc:
        print(f"box stand-in {argv[0]}: the box server did not answer: {exc}", file=sys.stderr)
        return 255
    for path, data in answer["writes"].items():
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
    sys.stdout.write(answer["stdout"])
    sys.stderr.write(answer["stderr"])
    sys.stdout.flush()
    sys.stderr.flush()
    if answer.get("exec"):  # a training job's docker run: its command runs here, in place of the container
        job = answer["exec"]
        os.chdir(job["cwd"])
        os.execvpe(job["argv"][0], job["argv"], {**os.environ, **job["env"]})
    if answer["after"]:
        os.execv(answer["after"][0], answer["after"]) if answer["after"][0].endswith("shutdown") else subprocess.run(
            answer["after"], check=False
        )
    return answer["rc"]


if __name__ == "__main__":
    sys.exit(main())
