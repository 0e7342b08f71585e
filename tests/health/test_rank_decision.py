"""One rank decision per cluster (gpuinfra/health/ranks.py, HealthNode.peers): the first node
that decides stores its decision create-only, every node ranks with the stored one.

The race runs through the real CLIs too: ``aws s3api put-object --if-none-match "*"`` against
moto S3 on 127.0.0.1, ``gcloud storage cp --if-generation-match=0`` against a Cloud Storage
JSON API stand-in on 127.0.0.1 (tests/health/fake_gcs.py); each skips without its CLI."""

from __future__ import annotations

import ast
import io
import json
import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from gpuinfra.errors import PreconditionFailed, RankDecisionError
from gpuinfra.health.gate import health_key
from gpuinfra.health.node import (
    EXIT_EXCLUDED,
    EXIT_UNDECIDED,
    Bucket,
    NodeConfig,
    peers_exit,
    run_command,
)
from gpuinfra.health.ranks import (
    RETRY_SECONDS,
    WRITE_TRIES,
    DecisionScope,
    RankDecision,
)
from gpuinfra.services.health_report import ResultsLocation, read_health
from tests.health.fake_gcs import FakeGcs
from tests.health.test_node_runner import MemoryBucket, _doc, make_node, p4d_runner

A, B, C = "10.0.0.7", "10.0.0.9", "10.0.0.20"
LISTED = [A, B, C]  # numeric order, as gpuinfra-cluster-env lists them
NODES = {A: "i-0a", B: "i-0b", C: "i-0c"}
#: this deployment's results_not_before (the stack file's created_at); results are checked now
DEPLOYED = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
PREFIX = "health/train/"
# what AWS CLI 1.45 prints for S3 errors (exit 255; AWS CLI v2 exits 254), seen against moto
AWS_412 = (
    "\nAn error occurred (PreconditionFailed) when calling the PutObject operation: At least one of the "
    "pre-conditions you specified did not hold\n"
)
AWS_403 = "\nAn error occurred (AccessDenied) when calling the PutObject operation: Access Denied\n"
AWS_409 = (
    "\nAn error occurred (ConditionalRequestConflict) when calling the PutObject operation: A conflicting "
    "conditional operation is currently in progress against this resource.\n"
)


def node(tmp_path, address, bucket, not_before=DEPLOYED):
    health, _ = make_node(
        tmp_path / NODES.get(address, address),
        p4d_runner(),
        node=NODES.get(address, address),
        address=address,
        bucket=bucket,
        results_not_before=not_before,
    )
    health.sleep = lambda s: pytest.fail(f"slept {s} s: a decision was there to read")
    return health


def upload_result(bucket, tmp_path, address, passed=True):
    path = tmp_path / f"{NODES[address]}.json"
    path.write_bytes(_doc(NODES[address], address, passed=passed))
    bucket.put(health_key("train", NODES[address]), path)


def stored(bucket, not_before=DEPLOYED, listed=LISTED) -> RankDecision:
    return RankDecision.from_json(bucket.read_prefix(PREFIX)[DecisionScope("train", tuple(listed), not_before).key])


class FakeAwsCli:
    """``aws s3api put-object --if-none-match *`` and ``aws s3 cp --recursive`` over a dict, with
    scripted answers for the create-only puts ((exit code, output); ``landed``: the object is
    stored although the CLI failed, as when its answer is lost)."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.script: list[tuple[int, str, bool]] = []
        self.puts = 0

    def __call__(self, argv, timeout):
        if argv[:3] == ["aws", "s3api", "put-object"]:
            assert argv[argv.index("--if-none-match") + 1] == "*"
            key, body = argv[argv.index("--key") + 1], Path(argv[argv.index("--body") + 1]).read_bytes()
            self.puts += 1
            if self.script:
                rc, out, landed = self.script.pop(0)
                if landed:
                    self.objects[key] = body
                return rc, out
            if key in self.objects:
                return 255, AWS_412
            self.objects[key] = body
            return 0, '{"ETag": "\\"9a0364b9e99bb480dd25e1f0284c8555\\""}\n'
        if argv[:3] == ["aws", "s3", "cp"] and "--recursive" in argv:
            prefix, dest = argv[-2].removeprefix("s3://bkt/"), Path(argv[-1])
            for key, body in self.objects.items():
                if key.startswith(prefix):
                    (dest / key[len(prefix) :]).parent.mkdir(parents=True, exist_ok=True)
                    (dest / key[len(prefix) :]).write_bytes(body)
            return 0, ""
        if argv[:3] == ["aws", "s3", "cp"]:
            self.objects[argv[-1].removeprefix("s3://bkt/")] = Path(argv[-2]).read_bytes()
            return 0, ""
        return 127, f"{argv[0]}: unexpected {argv}\n"


@pytest.fixture(params=["aws", "gcp"])
def cli_bucket(request, monkeypatch, moto_url, tmp_path):
    """The stack bucket through the cloud's real CLI against a local server."""
    cloud = request.param
    if not shutil.which("aws" if cloud == "aws" else "gcloud"):
        pytest.skip(f"{'aws' if cloud == 'aws' else 'gcloud'} CLI not installed")
    name = f"ranks-{uuid.uuid4().hex[:12]}"
    if cloud == "aws":
        for var, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": moto_url,
        }.items():
            monkeypatch.setenv(var, value)
        boto3.client("s3", endpoint_url=moto_url).create_bucket(Bucket=name)
        yield Bucket("aws", name, run_command)
        return
    server = FakeGcs()
    server.thread.start()
    for var, value in {
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": server.url,
        "CLOUDSDK_CORE_PROJECT": "p",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
    }.items():
        monkeypatch.setenv(var, value)
    yield Bucket("gcp", name, run_command)
    server.shutdown()
    server.server_close()


def test_a_result_landing_between_two_deadlines_gives_every_node_the_same_ranks(cli_bucket, tmp_path):
    bucket = cli_bucket
    upload_result(bucket, tmp_path, A)
    upload_result(bucket, tmp_path, B)
    # node A's deadline comes first: C has no result yet, so A ranks A and B and stores that
    assert node(tmp_path, A, bucket).peers(LISTED, wait_seconds=0) == [A, B]
    # C's (passing) result lands before B's deadline; on its own B would now rank all three
    upload_result(bucket, tmp_path, C)
    assert node(tmp_path, B, bucket).peers(LISTED, wait_seconds=600) == [A, B]
    # the late node reads the stored decision, is not in it: no rank, exit EXIT_EXCLUDED as before
    out, err = io.StringIO(), io.StringIO()
    assert peers_exit(node(tmp_path, C, bucket), LISTED, out, err) == EXIT_EXCLUDED
    assert out.getvalue() == f"{A}\n{B}\n" and err.getvalue() == ""
    decision = stored(bucket)
    assert (decision.decided_by, decision.decided_by_address, decision.trigger) == ("i-0a", A, "deadline")
    assert decision.listed == tuple(LISTED) and decision.ranked == (A, B)
    assert {a: (r["node"], r["stage"], r["passed"]) for a, r in decision.results.items()} == {
        A: ("i-0a", "local", True),
        B: ("i-0b", "local", True),
    }
    # the cloud refuses a second decision: 412, told apart from other failures
    other = tmp_path / "other.decision"
    other.write_text("{}")
    with pytest.raises(PreconditionFailed):
        bucket.put_new(DecisionScope("train", tuple(LISTED), DEPLOYED).key, other)


def test_the_node_that_loses_the_write_ranks_with_the_winners_decision(tmp_path):
    """A read before C's result landed, B after; A's write lands between B's read and B's write."""
    cli = FakeAwsCli()
    for address in (A, B):
        upload_result(Bucket("aws", "bkt", cli), tmp_path, address)
    late_writes = []

    class Deferred(Bucket):  # A's write, held back until B has read
        def put_new(self, key, path):
            late_writes.append((key, Path(path).read_bytes()))

    assert node(tmp_path, A, Deferred("aws", "bkt", cli)).peers(LISTED, wait_seconds=0) == [A, B]
    upload_result(Bucket("aws", "bkt", cli), tmp_path, C)

    class LandsAfterRead(Bucket):
        def read_prefix(self, prefix):
            docs = super().read_prefix(prefix)
            for key, body in late_writes:
                cli.objects[key] = body
            late_writes.clear()
            return docs

    b = node(tmp_path, B, LandsAfterRead("aws", "bkt", cli))
    puts = cli.puts
    assert b.peers(LISTED, wait_seconds=600) == [A, B]  # B saw every result (its own would rank A, B, C)
    assert cli.puts == puts + 1  # one write (412), then the read-back, no retry
    assert stored(Bucket("aws", "bkt", cli)).decided_by == "i-0a"


def test_a_decision_of_an_earlier_deployment_is_not_read(tmp_path):
    bucket = MemoryBucket()
    earlier = DEPLOYED - timedelta(days=2)
    old_scope = DecisionScope("train", tuple(LISTED), earlier)  # same addresses, reused by the new deployment
    old = old_scope.propose([A], {}, "i-old", A, "deadline", decided_at=earlier + timedelta(minutes=50))
    bucket.objects[old_scope.key] = old.to_json().encode()
    for address in LISTED:
        upload_result(bucket, tmp_path, address)
    assert node(tmp_path, B, bucket).peers(LISTED, wait_seconds=600) == [A, B, C]
    new_key = DecisionScope("train", tuple(LISTED), DEPLOYED).key
    assert new_key != old_scope.key and bucket.objects[old_scope.key] == old.to_json().encode()
    assert stored(bucket).decided_by == "i-0b" and stored(bucket).trigger == "all-results"
    # an object at this deployment's key that says it is another deployment's: never used, never
    # overwritten, and the node prints no ranking of its own
    bucket.objects[new_key] = json.dumps({**old.to_dict(), "results_not_before": earlier.isoformat()}).encode()
    with pytest.raises(RankDecisionError, match="is not this deployment's rank decision .written for the deployment"):
        node(tmp_path, A, bucket).peers(LISTED, wait_seconds=0)
    out, err = io.StringIO(), io.StringIO()
    assert peers_exit(node(tmp_path, A, bucket), LISTED, out, err) == EXIT_UNDECIDED
    assert out.getvalue() == "" and "no rank decision" in err.getvalue()


def test_the_key_is_scoped_to_the_deployment_and_the_listed_addresses():
    key = DecisionScope("train", (C, A, B), DEPLOYED).key
    assert key == DecisionScope("train", (A, B, C), DEPLOYED).key  # the order the nodes list them in does not matter
    assert key.startswith(f"health/train/ranks-{DEPLOYED.strftime('%Y%m%dT%H%M%SZ')}-")
    assert key.endswith(".decision") and not key.endswith(".json")
    assert key != DecisionScope("train", (A, B), DEPLOYED).key
    assert key != DecisionScope("train", (A, B, C), DEPLOYED + timedelta(microseconds=1)).key
    assert key != DecisionScope("train", (A, B, C), DEPLOYED - timedelta(days=1)).key
    assert DecisionScope("other", (A, B, C), DEPLOYED).key.startswith("health/other/ranks-")
    assert DecisionScope("train", (A, B, C)).key.startswith("health/train/ranks-any-")  # no results_not_before


def test_gpuinfra_check_does_not_read_the_decision_as_a_node_result(moto_url, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=moto_url)
    s3.create_bucket(Bucket="ranks-check")
    scope = DecisionScope("train", (A, B), DEPLOYED)
    s3.put_object(Bucket="ranks-check", Key=scope.key, Body=scope.propose([A], {}, "i-0a", A, "deadline").to_json())
    s3.put_object(Bucket="ranks-check", Key=health_key("train", "i-0a"), Body=_doc("i-0a", A))
    report = read_health(ResultsLocation("aws", "ranks-check", "train", 2, DEPLOYED, "test"), client=s3)
    assert [n.node for n in report.nodes] == ["i-0a"] and report.invalid == ()


@pytest.mark.parametrize(
    "answers, writes, stored_in_the_end",
    [
        # access denied every time: no decision, never this node's own
        ([(255, AWS_403, False)] * WRITE_TRIES, WRITE_TRIES, False),
        # a concurrent conditional write (409), nothing stored by it: another try goes through
        ([(255, AWS_409, False)], 2, True),
        # the CLI timed out but the write had landed: read back, no second write
        ([(124, "\ntimed out after 120 s\n", True)], 1, True),
    ],
)
def test_a_failed_write_is_read_back_and_retried_never_replaced_by_a_private_decision(
    tmp_path, answers, writes, stored_in_the_end
):
    cli = FakeAwsCli()
    bucket = Bucket("aws", "bkt", cli)
    for address in LISTED:
        upload_result(bucket, tmp_path, address)
    cli.script = list(answers)
    me, sleeps = node(tmp_path, A, bucket), []
    me.sleep = sleeps.append
    if not stored_in_the_end:
        with pytest.raises(
            RankDecisionError,
            match=f"s3://bkt/health/train/ranks-.*{WRITE_TRIES} tries: create-only "
            "upload to .* failed .255.: An error occurred .AccessDenied.",
        ):
            me.peers(LISTED, wait_seconds=0)
        assert cli.puts == writes and sleeps == [RETRY_SECONDS] * (writes - 1)
        assert not any(k.endswith(".decision") for k in cli.objects)
        out, err = io.StringIO(), io.StringIO()
        cli.script = list(answers)
        assert peers_exit(me, LISTED, out, err) == EXIT_UNDECIDED and out.getvalue() == ""
        assert err.getvalue().startswith(
            "gpuinfra-health: no rank decision, this node takes no rank yet: could not "
            "store or read the rank decision s3://bkt/health/train/ranks-"
        )
        return
    assert me.peers(LISTED, wait_seconds=0) == [A, B, C] and stored(bucket).decided_by == "i-0a"
    assert cli.puts == writes and sleeps == [RETRY_SECONDS] * (writes - 1)


def test_report_mode_stores_no_decision(tmp_path):
    bucket = MemoryBucket()
    me = node(tmp_path, A, bucket)
    me.config = NodeConfig("aws", "train", "bkt", "report")
    assert me.peers(LISTED, wait_seconds=600) == LISTED and not bucket.objects


def test_the_node_bundle_ships_every_gpuinfra_module_the_node_imports():
    """The nodes run gpuinfra's modules from the bundle (gpuinfra/plan/node_bundle.py
    NODE_MODULES): a module the node imports but the bundle lacks fails at boot."""
    from gpuinfra.plan.node_bundle import NODE_MODULES

    package = Path(__file__).resolve().parents[2] / "gpuinfra"
    missing = []
    for rel in NODE_MODULES:
        for stmt in ast.walk(ast.parse((package / rel).read_text())):
            if not isinstance(stmt, ast.ImportFrom) or not (stmt.module or "").startswith("gpuinfra."):
                continue
            folder = "/".join(stmt.module.split(".")[1:])
            # the module itself, or a submodule imported by name (from gpuinfra.health import parsers)
            for path in [f"{folder}.py", *(f"{folder}/{alias.name}.py" for alias in stmt.names)]:
                if (package / path).is_file() and path not in NODE_MODULES:
                    missing.append(f"{path} (imported by {rel})")
    assert not missing, f"add to NODE_MODULES: {', '.join(sorted(set(missing)))}"
