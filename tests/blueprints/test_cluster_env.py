"""``gpuinfra-cluster-env`` (AWS) run for real with stand-ins for curl, aws and the health gate's
``peers`` command: ranks go only to the nodes that passed the health gate."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpuinfra.agent.constants import TORCHRUN_PORT
from gpuinfra.plan.boot import render_cluster_env
from gpuinfra.plan.naming import AWS_STACK_ID_TAG
from gpuinfra.plan.node_bundle import health_template_vars
from gpuinfra.plan.tags import AWS_DEPLOYMENT_TAG
from tests.blueprints.helpers import make_spec

PEERS = "10.0.0.20\n10.0.0.7\n10.0.1.5"


def _render(gate: str, deployment: str) -> str:
    """The AWS cluster-env script of a 3-node p4d stack with health gate ``gate``."""
    spec = make_spec("p4d.24xlarge", nodes=3, profile_updates={"health_gate": gate})
    return render_cluster_env(
        "aws-cluster-env.sh.j2",
        stack="train-abc123",
        stack_tag=AWS_STACK_ID_TAG,
        nodes=3,
        gpus_per_node=8,
        master_port=TORCHRUN_PORT,
        wait_seconds=5,
        deployment=deployment,
        deployment_tag=AWS_DEPLOYMENT_TAG,
        **health_template_vars(spec),
    )


def run_cluster_env(
    tmp_path,
    *,
    my_ip: str,
    ranked: str | None,
    peers_rc: int = 0,
    gate: str = "enforce",
    listed: str = "10.0.0.7\t10.0.1.5\t10.0.0.20",
    deployment: str = "0123456789ab",
    stored: str | None = None,
):
    """Run the rendered script once. ``listed``: what ``aws ec2 describe-instances`` answers;
    ``ranked``/``peers_rc``: the gate's ``peers`` answer; ``stored``: its ``peers --stored-only``
    answer (None: no stored ranking, exit 5). Every call's arguments go to ``peers-args`` /
    ``stored-args`` / ``aws-args``."""
    if os.name != "posix":
        pytest.skip("bash only")
    etc = tmp_path / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    script = _render(gate, deployment)
    script = (
        script.replace("/etc/gpuinfra", str(etc))
        .replace("/run/gpuinfra", str(tmp_path / "run"))
        .replace("/var/lib/gpuinfra", str(tmp_path / "var"))
    )
    (tmp_path / "env.sh").write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stubs = {
        "curl": f'case "$*" in *api/token*) echo t ;; *placement/region*) echo us-east-1 ;; *local-ipv4*) echo {my_ip} ;; esac',
        "aws": f'echo "$*" >> "{tmp_path}/aws-args"; printf \'{listed}\\n\'',
        "python3": (
            f'if [ "$4" = --stored-only ]; then echo "$*" > "{tmp_path}/stored-args"; '
            '[ -n "$STORED" ] || exit 5; printf "%s\\n" "$STORED"; exit 0; fi; '
            f'echo "$*" > "{tmp_path}/peers-args"; printf "%s\\n" "$RANKED"; exit {peers_rc}'
        ),
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RANKED": ranked or "", "STORED": stored or ""}
    result = subprocess.run(["bash", str(tmp_path / "env.sh")], env=env, capture_output=True, text=True, timeout=60)
    cluster_env = etc / "cluster.env"
    return result, (
        dict(line.split("=", 1) for line in cluster_env.read_text().splitlines()) if cluster_env.exists() else None
    )


def test_a_node_left_out_by_the_gate_shrinks_the_world(tmp_path):
    result, env = run_cluster_env(tmp_path, my_ip="10.0.1.5", ranked="10.0.0.7\n10.0.1.5")
    assert result.returncode == 0, result.stderr
    # the gate was asked about every node, in numeric order
    assert (tmp_path / "peers-args").read_text().split() == [
        "-m",
        "gpuinfra.health.node",
        "peers",
        "10.0.0.7",
        "10.0.0.20",
        "10.0.1.5",
    ]
    assert env == {
        "NNODES": "2",
        "NODE_RANK": "1",
        "NPROC_PER_NODE": "8",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29500",
    }
    assert "left out after the health gate: 10.0.0.20" in result.stderr
    assert (tmp_path / "run" / "ranks-decided").exists()  # the excluded node may end itself now


def test_the_failed_node_itself_gets_no_rank(tmp_path):
    result, env = run_cluster_env(tmp_path, my_ip="10.0.0.20", ranked="10.0.0.7\n10.0.1.5", peers_rc=3)
    assert result.returncode == 0 and env is None
    assert "this node failed the health gate and takes no rank" in result.stderr
    assert (tmp_path / "run" / "ranks-decided").exists()


def test_unreadable_results_retry_and_gate_off_ranks_everyone(tmp_path):
    result, env = run_cluster_env(tmp_path / "a", my_ip="10.0.0.7", ranked="", peers_rc=1)
    assert result.returncode == 75 and env is None  # systemd tries again
    result, env = run_cluster_env(tmp_path / "b", my_ip="10.0.0.7", ranked=None, gate="off")
    assert result.returncode == 0 and env["NNODES"] == "3" and env["NODE_RANK"] == "0"
    assert not (tmp_path / "b" / "peers-args").exists()


def test_a_shrunk_cluster_gets_the_same_ranks_after_a_reboot(tmp_path):
    """The gate left 10.0.0.20 out and it ended: 2 of the stack's 3 nodes remain listed. A later
    run (reboot, retry) reuses the kept ranking instead of waiting for a third node forever."""
    first, env = run_cluster_env(tmp_path, my_ip="10.0.1.5", ranked="10.0.0.7\n10.0.1.5")
    assert first.returncode == 0 and env["NNODES"] == "2"
    assert (tmp_path / "var" / "ranked-hostfile").read_text() == "10.0.0.7\n10.0.1.5\n"
    (tmp_path / "etc" / "cluster.env").unlink()  # ExecStartPre removes it at boot
    (tmp_path / "peers-args").unlink()
    again, env = run_cluster_env(tmp_path, my_ip="10.0.1.5", ranked=None, peers_rc=1, listed="10.0.0.7\t10.0.1.5")
    assert again.returncode == 0, again.stderr
    assert env == {
        "NNODES": "2",
        "NODE_RANK": "1",
        "NPROC_PER_NODE": "8",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29500",
    }
    assert not (tmp_path / "peers-args").exists()  # ranks kept: the gate was not asked again


def test_peers_are_listed_by_this_deployment_and_strangers_get_no_rank(tmp_path):
    """Only instances with this deployment's tag are listed (a same-named stack of another
    checkout, or an earlier deployment, has another id); when more nodes than the stack has still
    carry it (a fleet left by an interrupted `up`), no ranks are written instead of ranking them."""
    result, env = run_cluster_env(tmp_path / "a", my_ip="10.0.0.7", ranked=None, gate="off")
    assert result.returncode == 0 and env["NNODES"] == "3"
    filters = (tmp_path / "a" / "aws-args").read_text()
    assert "Name=tag:gpuinfra:stack-id,Values=train-abc123" in filters  # the stack's own id, not its bare name
    assert "Name=tag:gpuinfra:stack," not in filters
    assert "Name=tag:gpuinfra:deployment,Values=0123456789ab" in filters
    five = "10.0.0.7\t10.0.1.5\t10.0.0.20\t10.0.0.3\t10.0.0.9"  # 3 own nodes + 2 of an orphaned fleet
    for me in ("10.0.0.7", "10.0.0.20"):
        result, env = run_cluster_env(tmp_path / me, my_ip=me, ranked=None, gate="off", listed=five)
        assert result.returncode == 75 and env is None
        assert "5 nodes listed for 3; no ranks written" in result.stderr


def test_a_failed_peers_call_does_not_lock_the_node_out_after_an_excluded_node_ended(tmp_path):
    """The first `peers` call fails (exit 5) and the unit exits 75; meanwhile the gate left
    10.0.0.20 out and it ended. The retry lists 2 of 3 nodes: the ranking the deployment stored
    (asked with `peers --stored-only` and the listed addresses) gives this node its rank."""
    first, env = run_cluster_env(tmp_path, my_ip="10.0.0.7", ranked="", peers_rc=5)
    assert first.returncode == 75 and env is None
    (tmp_path / "peers-args").unlink()
    again, env = run_cluster_env(
        tmp_path, my_ip="10.0.0.7", ranked=None, listed="10.0.0.7\t10.0.1.5", stored="10.0.0.7\n10.0.1.5"
    )
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "stored-args").read_text().split()[2:] == ["peers", "--stored-only", "10.0.0.7", "10.0.1.5"]
    assert not (tmp_path / "peers-args").exists()
    assert env == {
        "NNODES": "2",
        "NODE_RANK": "0",
        "NPROC_PER_NODE": "8",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29500",
    }
    # no stored ranking (nothing decided yet): the node keeps waiting for every node, then exits 75
    (tmp_path / "var" / "ranked-hostfile").unlink()
    (tmp_path / "etc" / "cluster.env").unlink()
    waiting, env = run_cluster_env(tmp_path, my_ip="10.0.0.7", ranked=None, listed="10.0.0.7\t10.0.1.5")
    assert waiting.returncode == 75 and env is None and "only 2 of 3 nodes" in waiting.stderr


def test_the_instances_carry_the_deployment_tag_the_peers_are_listed_by():
    """The tag the script filters on is on every instance the launch template starts (and the
    GCP nodes carry the label)."""
    from tests.blueprints.helpers import preview

    spec = make_spec("p4d.24xlarge", nodes=2).model_copy(update={"deployment_id": "0123456789ab"})
    (template,) = preview(spec).of_type("aws:ec2/launchTemplate:LaunchTemplate")
    instance = next(t for t in template.inputs["tagSpecifications"] if t["resourceType"] == "instance")
    assert instance["tags"][AWS_DEPLOYMENT_TAG] == "0123456789ab"
    gcp = make_spec("a2-highgpu-8g", nodes=2, cloud="gcp").model_copy(update={"deployment_id": "0123456789ab"})
    (instance_template,) = preview(gcp).of_type("gcp:compute/instanceTemplate:InstanceTemplate")
    assert instance_template.inputs["labels"]["gpuinfra-deployment"] == "0123456789ab"


def _kept_ranks_listed_function() -> str:
    """The ``kept_ranks_listed`` function as the AWS script renders it (the include both clouds share)."""
    import re

    script = _render("enforce", "0123456789ab")
    return re.search(r"^kept_ranks_listed\(\) \{\n.*?^\}\n", script, re.S | re.M).group(0)


@pytest.mark.parametrize(("kept_extra", "listed"), [(0, True), (1, False), (20000, False)])
def test_a_kept_ranking_counts_only_when_every_node_it_ranks_is_listed(tmp_path, kept_extra, listed):
    """Under ``set -o pipefail`` a ``grep ... | grep -q .`` whose reader stops at its first line
    kills a writer still holding more than a pipe buffer (pipe(7), "Pipe capacity") with SIGPIPE,
    and the pipeline's status is then the writer's (bash(1), "Pipelines"): negated, a long list of
    kept nodes missing from the listing reads as "all listed". 20,000 gone nodes (~240 KB) is
    beyond today's node limit, but the function must not rest on a size limit to be right. Here 3
    nodes are listed; the kept ranking holds them plus ``kept_extra`` nodes that are gone."""
    if os.name != "posix":
        pytest.skip("bash only")
    ips = ["10.0.0.7", "10.0.0.20", "10.0.1.5"]
    kept = tmp_path / "kept"
    gone = [f"10.9.{i // 250}.{i % 250}" for i in range(kept_extra)]
    kept.write_text("".join(ip + "\n" for ip in ips + gone))
    harness = (
        "set -euo pipefail\n"
        + _kept_ranks_listed_function()
        + f'KEPT_RANKS={kept}\nMY_IP=10.0.0.7\nIPS="$(printf "%s\\n" {" ".join(ips)})"\n'
        + "if kept_ranks_listed; then echo listed; else echo missing; fi\n"
    )
    done = subprocess.run(["bash", "-c", harness], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == ("listed" if listed else "missing"), done.stderr
