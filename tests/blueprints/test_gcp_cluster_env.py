"""The GCP peer script and its formation watchdog (``templates/gcp-cluster-env.sh.j2``) run for
real with stand-ins for ``curl`` (the metadata server) and ``gcloud`` (the group and the bucket).

The watchdog releases a group (``resize --size 0``) that never formed, so that a stockout bills
nothing; it must never release a group that formed, even when a listing fails at that moment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuinfra.agent.constants import TORCHRUN_PORT
from gpuinfra.plan.boot import render_cluster_env
from gpuinfra.plan.boot_gcp import peers_prefix
from gpuinfra.plan.naming import gcp_bulk_instance_names
from gpuinfra.plan.node_bundle import health_template_vars
from tests.blueprints.helpers import make_spec

GROUP = "t-node"
ME, PEER = "t-node-aaaa", "t-node-bbbb"
MY_IP = "10.128.0.2"


def run_peer_script(
    tmp_path,
    *,
    storage_ls: str,
    running: str = ME,
    deployment: str = "0123456789ab",
    me: str = ME,
    describe: str = "exit 0",
    created_by: int = 200,
    nodes: int = 2,
):
    """Render the script of a ``nodes``-node spot stack and run it once to its (2 s) deadline.

    Args:
        storage_ls: the body of the ``gcloud storage ls`` stand-in (``{url}`` is the peers prefix).
        running: the group's RUNNING VMs (``list-instances``), one per line.
        me: this VM's name; describe: the body of the ``gcloud compute instances describe``
            stand-in (``$4`` is the VM's name); created_by: the HTTP status of this VM's
            ``created-by`` metadata key (200: a group member, 404: a VM of the bulk insert);
            nodes: the stack's node count.

    Returns:
        (the finished process, the gcloud calls, the peers prefix URL).
    """
    if os.name != "posix":
        pytest.skip("bash only")
    spec = make_spec("a2-highgpu-8g", nodes=nodes, cloud="gcp", spot=True, profile="cv-train").model_copy(
        update={"deployment_id": deployment}
    )
    url = f"gs://bkt/{peers_prefix(spec)}"
    script = render_cluster_env(
        "gcp-cluster-env.sh.j2",
        nodes=nodes,
        nic_count=0,
        group=GROUP,
        bulk_names=gcp_bulk_instance_names(GROUP, nodes),
        zone="me-west1-a",
        gpus_per_node=8,
        wait_seconds=2,
        master_port=TORCHRUN_PORT,
        bucket="bkt",
        peers_prefix=peers_prefix(spec),
        **health_template_vars(spec),
    )
    script = (
        script.replace("/etc/gpuinfra", str(tmp_path / "etc"))
        .replace("/run/gpuinfra", str(tmp_path / "run"))
        .replace("/var/lib/gpuinfra", str(tmp_path / "var"))
        .replace("sleep 15", "sleep 0.2")
        .replace("sleep 10", "sleep 0.1")
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "env.sh").write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "etc").mkdir(exist_ok=True)
    log = tmp_path / "calls"
    gcloud = (
        f'echo "gcloud $*" >> {log}\n'
        'case "$*" in\n'
        f"  *list-instances*) printf '%s\\n' {running} ;;\n"
        f'  "compute instances describe"*) {describe} ;;\n'
        f'  "storage ls"*) {storage_ls.format(url=url)} ;;\n'
        "  *) exit 0 ;;\n"
        "esac\n"
    )
    curl = (
        f'case "$*" in *network-interfaces/0/ip*) echo {MY_IP} ;; *instance/name*) echo {me} ;;\n'
        f"  *attributes/created-by*) printf {created_by} ;;\nesac\n"
    )
    # the health gate's ranking (`python3 -m gpuinfra.health.node peers IP...`): every listed
    # node passed, so it prints the addresses it was given; no stored ranking (--stored-only)
    python3 = 'if [ "$4" = --stored-only ]; then exit 1; fi\nprintf \'%s\\n\' "${@:4}"\n'
    for name, body in (("gcloud", gcloud), ("curl", curl), ("python3", python3)):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}")
        (bin_dir / name).chmod(0o755)
    done = subprocess.run(
        ["bash", str(tmp_path / "env.sh")],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, log.read_text().splitlines(), url


def resizes(calls):
    return [c for c in calls if "resize" in c]


def test_a_group_that_never_formed_is_released(tmp_path):
    """Control: the bucket listing works, shows only this node and no `.formed` marker, and the
    group runs 1 of 2 VMs: the cluster never formed and the group is released."""
    done, calls, url = run_peer_script(tmp_path, storage_ls=f"printf '%s\\n' {{url}}/{ME}/{MY_IP}")
    assert done.returncode == 75
    assert resizes(calls) == ["gcloud compute instance-groups managed resize t-node --zone me-west1-a --size 0 --quiet"]
    assert f"gcloud storage cp - {url}/{ME}/{MY_IP} --quiet" in calls  # published under this deployment


def test_a_formed_group_is_never_released_when_a_listing_fails(tmp_path):
    """Both VMs of a formed group were preempted; the group re-created this one first (fresh boot
    disk: no local marker). At its deadline the bucket listing fails (HTTP 503): the group is not
    released. With the listing working, the `.formed` markers of this deployment keep it."""
    failing = "echo 'ERROR: (gcloud.storage.ls) HTTPError 503: Service Unavailable' >&2; exit 1"
    done, calls, _ = run_peer_script(tmp_path / "fails", storage_ls=failing)
    assert done.returncode == 75 and resizes(calls) == []
    formed = f"printf '%s\\n' {{url}}/{ME}/{MY_IP} {{url}}/.formed/{ME} {{url}}/.formed/{PEER}"
    done, calls, _ = run_peer_script(tmp_path / "works", storage_ls=formed)
    assert done.returncode == 75 and resizes(calls) == []


def test_a_listing_without_this_node_counts_as_failed(tmp_path):
    """A listing that exits 0 but lacks this node's own entry (published before the loop) is not
    a listing of the bucket as it is: the group is not released on it."""
    done, calls, _ = run_peer_script(tmp_path, storage_ls="printf ''")
    assert done.returncode == 75 and resizes(calls) == []


def test_an_earlier_deployments_markers_are_not_read(tmp_path):
    """The peers prefix holds the deployment id: `.formed` markers of an earlier deployment of the
    same group (after `down` + `up`) sit under another prefix and never count as formed."""
    old = make_spec("a2-highgpu-8g", nodes=2, cloud="gcp", spot=True, profile="cv-train").model_copy(
        update={"deployment_id": "0a0a0a0a0a0a"}
    )
    earlier = f"gs://bkt/{peers_prefix(old)}"
    listing = f"printf '%s\\n' {{url}}/{ME}/{MY_IP} {earlier}/.formed/{ME} {earlier}/.formed/{PEER}"
    done, calls, url = run_peer_script(tmp_path, storage_ls=listing)
    assert url.endswith("/0123456789ab")
    assert earlier != url and done.returncode == 75 and len(resizes(calls)) == 1


#: This node and its peer as VMs of the bulk insert (fixed names, no group members).
BULK_ME, BULK_PEER = gcp_bulk_instance_names(GROUP, 2)
#: gcloud's answer for a VM that does not exist (Compute API 404).
NOT_FOUND = (
    'echo "ERROR: (gcloud.compute.instances.describe) Could not fetch resource:"; '
    "echo \" - The resource 'projects/p/zones/me-west1-a/instances/$4' was not found\"; exit 1"
)


def deletes(calls):
    return [c for c in calls if c.startswith("gcloud compute instances delete")]


def test_a_bulk_vm_of_a_cluster_that_never_formed_releases_the_group_and_deletes_itself(tmp_path):
    """This bulk VM runs (describe: RUNNING), its peer is gone (was not found), the group has no
    member: the cluster never formed, so the group is released and this VM -- no ``created-by``
    key -- deletes itself; the peer is described only once it published an address."""
    both = f"printf '%s\\n' {{url}}/{BULK_ME}/{MY_IP} {{url}}/{BULK_PEER}/10.128.0.3"
    describe = f'if [ "$4" = {BULK_ME} ]; then echo RUNNING; else {NOT_FOUND}; fi'
    done, calls, _ = run_peer_script(
        tmp_path, storage_ls=both, running="", me=BULK_ME, describe=describe, created_by=404
    )
    assert done.returncode == 75
    assert len(resizes(calls)) == 1
    assert deletes(calls) == [f"gcloud compute instances delete {BULK_ME} --zone me-west1-a --quiet"]
    described = {c.split()[4] for c in calls if c.startswith("gcloud compute instances describe")}
    assert described == {BULK_ME, BULK_PEER}
    # the peer that never published is never described
    done, calls, _ = run_peer_script(
        tmp_path / "alone",
        storage_ls=f"printf '%s\\n' {{url}}/{BULK_ME}/{MY_IP}",
        running="",
        me=BULK_ME,
        describe="echo RUNNING",
        created_by=404,
    )
    assert {c.split()[4] for c in calls if c.startswith("gcloud compute instances describe")} == {BULK_ME}
    assert deletes(calls) and resizes(calls)


def test_a_failed_describe_is_no_listing_and_releases_nothing(tmp_path):
    """A describe that fails for another reason than "was not found" (HTTP 503) is no answer:
    the listing does not count and nothing is released or deleted."""
    both = f"printf '%s\\n' {{url}}/{BULK_ME}/{MY_IP} {{url}}/{BULK_PEER}/10.128.0.3"
    unavailable = f'if [ "$4" = {BULK_ME} ]; then echo RUNNING; else echo "ERROR: HTTPError 503" >&2; exit 1; fi'
    done, calls, _ = run_peer_script(
        tmp_path, storage_ls=both, running="", me=BULK_ME, describe=unavailable, created_by=404
    )
    assert done.returncode == 75 and resizes(calls) == [] and deletes(calls) == []


def test_a_group_member_releases_the_group_but_never_deletes_itself(tmp_path):
    """A member of the group (``created-by`` present) releases the group as before; the group
    deletes its VMs, the VM does not delete itself through the instances API."""
    done, calls, _ = run_peer_script(tmp_path, storage_ls=f"printf '%s\\n' {{url}}/{ME}/{MY_IP}", created_by=200)
    assert done.returncode == 75 and len(resizes(calls)) == 1 and deletes(calls) == []


def test_bulk_vms_and_group_members_together_form_the_cluster(tmp_path):
    """A replacement (group member) and a surviving bulk VM: both count, the cluster has its 2
    nodes and the script goes past the peer wait (no deadline, no release)."""
    listing = f"printf '%s\\n' {{url}}/{ME}/{MY_IP} {{url}}/{BULK_PEER}/10.128.0.3 {{url}}/{BULK_ME}/10.128.0.9"
    describe = f'if [ "$4" = {BULK_PEER} ]; then echo RUNNING; else {NOT_FOUND}; fi'
    done, calls, _ = run_peer_script(tmp_path, storage_ls=listing, running=ME, describe=describe, created_by=200)
    # one round: both listed and published at once, so the loop ends (on to the ranks) at once
    assert [c for c in calls if c.startswith("gcloud storage ls")] == [calls[2]]
    assert "no ranks written" not in done.stderr and resizes(calls) == [] and deletes(calls) == []
    # the gone bulk VM's stale entry (10.128.0.9) is described too (and answered "was not found")
    assert sum(c.startswith("gcloud compute instances describe") for c in calls) == 2


def test_the_startup_script_names_the_stacks_own_bulk_vms():
    """The rendered startup script carries the fixed names of the stack's bulk insert, built from
    the stack's own group name (one definition: gcp_bulk_instance_names), quoted as shell words."""
    from gpuinfra.plan.boot_gcp import node_prefix, render_startup_script
    from gpuinfra.plan.gcp import plan_gcp_cluster

    spec = make_spec("a3-megagpu-8g", nodes=3, cloud="gcp", profile="llm-pretrain")
    group = node_prefix(spec)
    script = render_startup_script(spec, plan_gcp_cluster(spec), "bkt")
    assert f'BULK_NAMES="{group}-n000 {group}-n001 {group}-n002"\n' in script
    assert f"list-instances {group} --zone" in script


#: A stateful ``gcloud compute instances describe`` stand-in: ``statuses.json`` maps a VM name to
#: the statuses its successive describes answer (the last one repeats); a name absent from it
#: answers "was not found" (Compute API 404). ``$4`` is the VM's name.
STATEFUL_DESCRIBE = (
    f"{sys.executable} -c 'import json, sys, pathlib\n"
    "name, state = sys.argv[1], pathlib.Path(sys.argv[2])\n"
    'seq = json.loads((state / "statuses.json").read_text()).get(name)\n'
    "if seq is None:\n"
    '    print("ERROR: The resource was not found"); sys.exit(1)\n'
    'n = state / ("n-" + name); i = int(n.read_text()) if n.exists() else 0; n.write_text(str(i + 1))\n'
    'print(seq[min(i, len(seq) - 1)])\' "$4" {state}'
)


def _describes(calls) -> list[str]:
    return [c.split()[4] for c in calls if c.startswith("gcloud compute instances describe")]


def _eight(tmp_path, statuses: dict[str, list[str]]):
    """8 bulk VMs that all published an address; this node is n000; the describe answers come
    from ``statuses``."""
    import json

    names = gcp_bulk_instance_names(GROUP, 8)
    ips = {name: f"10.128.0.{10 + i}" for i, name in enumerate(names)}
    ips[names[0]] = MY_IP
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "statuses.json").write_text(json.dumps(statuses))
    listing = "printf '%s\\n' " + " ".join(f"{{url}}/{n}/{ip}" for n, ip in ips.items())
    done, calls, _ = run_peer_script(
        tmp_path,
        storage_ls=listing,
        running="",
        me=names[0],
        describe=STATEFUL_DESCRIBE.format(state=tmp_path),
        created_by=404,
        nodes=8,
    )
    return names, ips, done, calls


def test_a_name_seen_running_is_not_read_again_until_the_deciding_round(tmp_path):
    """8 bulk VMs; n005 answers STAGING twice, then RUNNING. Each round reads only the names not
    yet seen RUNNING (not all 8 a round: 8 nodes x 8 names every 15 s would spend 64 reads a round
    of the project's Compute read quota); the round that reaches 8 rests on earlier reads, so all 8
    are read again at once before the ranks are written. Reads: 8 + 1 + 1 + 8 = 18."""
    names = gcp_bulk_instance_names(GROUP, 8)
    statuses = {n: ["RUNNING"] for n in names}
    statuses[names[5]] = ["STAGING", "STAGING", "RUNNING"]
    names, ips, done, calls = _eight(tmp_path, statuses)
    assert "no ranks written" not in done.stderr, done.stderr
    described = _describes(calls)
    assert len(described) == 18, described
    assert described[8:10] == [names[5], names[5]]
    assert sorted(described[-8:]) == sorted(names)
    hostfile = (tmp_path / "etc" / "hostfile").read_text().split()
    assert hostfile == sorted(ips.values(), key=lambda ip: [int(x) for x in ip.split(".")])


def test_a_vm_gone_since_it_was_seen_gets_no_rank(tmp_path):
    """n003 is RUNNING at first, then gone (was not found) by the round that would reach 8: the
    re-read at that round drops it, so no ranks are written and the node waits to its deadline."""
    names = gcp_bulk_instance_names(GROUP, 8)
    statuses = {n: ["RUNNING"] for n in names}
    statuses[names[5]] = ["STAGING", "RUNNING"]
    statuses[names[3]] = ["RUNNING", "TERMINATED"]
    names, _, done, calls = _eight(tmp_path, statuses)
    assert "only 7 of 8 nodes" in done.stderr, done.stderr
    assert not (tmp_path / "etc" / "hostfile").exists()


def test_a_bucket_listing_larger_than_a_pipe_still_forms_the_cluster(tmp_path):
    """A large cluster's bucket listing (one ~100-byte entry a node: ~650 nodes fill Linux's
    64 KiB pipe buffer, pipe(7) "Pipe capacity") is searched for this node's entry and each peer's
    while the script runs under ``set -o pipefail``. ``printf ... | grep -q`` there is wrong: grep
    exits at its first match, the writer still holding the rest of the text dies of SIGPIPE, and
    pipefail makes the whole test false ("the return status of a pipeline is the value of the last
    (rightmost) command to exit with a non-zero status": bash(1), "Pipelines") -- this node's entry
    reads as missing and the cluster never forms. Here both bulk VMs run and published first; the
    listing goes on with 4,000 stale entries of VMs that no longer run: the 2 nodes form."""
    entries = f"{{url}}/{BULK_ME}/{MY_IP} {{url}}/{BULK_PEER}/10.128.0.3"
    stale = "for i in $(seq 1000 4999); do echo {url}/t-node-gone-$i/10.200.${{i:0:2}}.${{i:2}}; done"
    done, calls, _ = run_peer_script(
        tmp_path,
        storage_ls=f"printf '%s\\n' {entries}; {stale}",
        running="",
        me=BULK_ME,
        describe="echo RUNNING",
        created_by=404,
    )
    assert "no ranks written" not in done.stderr, done.stderr
    assert (tmp_path / "etc" / "hostfile").read_text().split() == [MY_IP, "10.128.0.3"]
    assert resizes(calls) == [] and deletes(calls) == []


def test_a_group_member_named_like_a_bulk_vm_counts_once(tmp_path):
    """A managed instance group names its VMs ``<group>-`` + "a random four-character string"
    (cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers, ``baseInstanceName``),
    which can be ``n`` + 3 digits, a name of the stack's bulk insert: such a member is listed by
    the group and, published and RUNNING, found by name too. It is one node: a 3-node cluster with
    2 VMs up does not form, and a 2-node one ranks 2 distinct addresses."""
    member = gcp_bulk_instance_names(GROUP, 3)[1]
    listing = f"printf '%s\\n' {{url}}/{ME}/{MY_IP} {{url}}/{member}/10.128.0.3"
    done, calls, _ = run_peer_script(
        tmp_path / "three", storage_ls=listing, running=f"{ME} {member}", describe="echo RUNNING", nodes=3
    )
    assert "only 2 of 3 nodes" in done.stderr, done.stderr
    assert not (tmp_path / "three" / "etc" / "hostfile").exists()
    done, calls, _ = run_peer_script(
        tmp_path / "two", storage_ls=listing, running=f"{ME} {member}", describe="echo RUNNING", nodes=2
    )
    assert (tmp_path / "two" / "etc" / "hostfile").read_text().split() == [MY_IP, "10.128.0.3"]
    assert "NNODES=2\n" in (tmp_path / "two" / "etc" / "cluster.env").read_text()
