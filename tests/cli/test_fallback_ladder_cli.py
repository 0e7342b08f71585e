"""`new --fallback N` writes a ladder of checked alternatives; `up --fallback` forms the first rung
the cloud has capacity for. The Automation API is replaced at its boundary by the recording fake of
the lifecycle tests; stockouts are injected there as the capacity error the AWS program raises."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from gpuinfra.catalog.store import load_catalog
from gpuinfra.errors import CapacityError, MissingDependencyError, NotOfferedError, QuotaError
from gpuinfra.offers import OfferQuery, find_offers, gpu_request
from gpuinfra.stackfile import read_stack_spec
from tests.cli.test_lifecycle_cli import FakeBackend, _use
from tests.test_preflight import aws  # noqa: F401 (fixture: moto EC2 / CloudWatch and a Service Quotas stand-in)

H100_PAIR = ("new", "--gpus", "8xH100", "--nodes", "2")
# lora-finetune prefers spot: in one zone the ladder is its spot offer, then its on-demand one
SPOT_THEN_ON_DEMAND = (*H100_PAIR, "--zone", "use1-az1", "--profile", "lora-finetune", "--name", "lad")


class StockoutBackend(FakeBackend):
    """The recording fake whose ``up`` of the stacks in ``fail`` raises their error."""

    def __init__(self, fail: dict[str, Exception], **kwargs):
        super().__init__(**kwargs)
        self.fail_for = fail

    def up(self, project_dir, stack, on_event):
        self.calls.append(("up", stack))
        if stack in self.fail_for:
            raise self.fail_for[stack]
        self.deployed.add(stack)
        return {"create": 41}


def _record(project: Path, first: str) -> dict:
    return yaml.safe_load((project / "ladders" / f"{first}.yaml").read_text())


def _with_aws_credentials(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_fallback_3_writes_four_checked_stacks_spread_over_regions(run_cli, tmp_path):
    plain = run_cli(*H100_PAIR, "--project-dir", str(tmp_path / "plain"), "--json")
    assert plain.exit_code == 0, plain.stderr
    result = run_cli(*H100_PAIR, "--fallback", "3", "--project-dir", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    names = ["aws-8xh100-2n", "aws-8xh100-2n-fb1", "aws-8xh100-2n-fb2", "aws-8xh100-2n-fb3"]
    ladder = doc["ladder"]
    assert [r["stack"] for r in ladder["rungs"]] == names
    # the embedded catalog's on-demand 8xH100 pairs: p5.48xlarge in six us-east-1 zones, three of
    # us-east-2 and four of us-west-2 at the same price, then eu-north-1; a stockout of a large type
    # is often region-wide, so the ladder takes another region for each alternative
    assert [(r["cloud"], r["region"], r["zone"], r["instance_type"], r["market"]) for r in ladder["rungs"]] == [
        ("aws", "us-east-1", "use1-az1", "p5.48xlarge", "on-demand"),
        ("aws", "us-east-2", "use2-az1", "p5.48xlarge", "on-demand"),
        ("aws", "us-west-2", "usw2-az1", "p5.48xlarge", "on-demand"),
        ("aws", "eu-north-1", "eun1-az1", "p5.48xlarge", "on-demand"),
    ]
    assert sorted(p.name for p in (tmp_path / "stacks").iterdir()) == sorted(f"Pulumi.{n}.yaml" for n in names)
    assert ladder["stack_files"] == [str(tmp_path / "stacks" / f"Pulumi.{n}.yaml") for n in names]
    # rung 0 is what a plain `new` writes
    first = json.loads(plain.stdout)
    assert (first["zone"], first["instance_type"]) == (ladder["rungs"][0]["zone"], ladder["rungs"][0]["instance_type"])
    assert doc["stack"] == names[0]
    catalog = load_catalog()
    compute, regions = [], set()
    for rung in ladder["rungs"]:
        spec = read_stack_spec(tmp_path, rung["stack"])
        # each stack file is the rung the record names, and its price is the catalog's for it
        assert (spec.cloud, spec.region, spec.zone, spec.instance_type) == (
            rung["cloud"],
            rung["region"],
            rung["zone"],
            rung["instance_type"],
        )
        assert rung["market"] == ("spot" if spec.spot else "on-demand")
        assert Decimal(rung["compute_price_per_hour_usd"]) == catalog.node_hour_price_usd(spec) * spec.nodes
        compute.append(Decimal(rung["compute_price_per_hour_usd"]))
        regions.add((rung["cloud"], rung["region"], rung["market"]))
        if rung["hourly_usd"] is not None:  # a line without a catalog price leaves the total open
            assert Decimal(rung["hourly_change_usd"]) == Decimal(rung["hourly_usd"]) - Decimal(
                ladder["rungs"][0]["hourly_usd"]
            )
        else:
            assert rung["lines_without_price"] > 0 and rung["hourly_change_usd"] is None
    assert compute == sorted(compute)  # price order among the chosen rungs
    assert len(regions) == 4  # distinct regions: the catalog offers more than four
    # the alternatives are the three cheapest other regions, each at its cheapest zone
    ranked = find_offers(catalog, OfferQuery(request=gpu_request(catalog, "8xH100", None, None, 2), market="on-demand"))
    best: dict[tuple[str, str], object] = {}
    for offer in ranked:
        best.setdefault((offer.offer.cloud, offer.offer.region), offer)
    others = [o for key, o in best.items() if key != ("aws", "us-east-1")]
    assert [(r["region"], r["zone"]) for r in ladder["rungs"][1:]] == [
        (o.offer.region, o.offer.zone) for o in others[:3]
    ]
    # no offer of the request is cheaper than rung 0 (the ranking starts at its cheapest)
    assert Decimal(ladder["rungs"][0]["compute_price_per_hour_usd"]) == Decimal(first["compute_price_per_hour_usd"])
    assert _record(tmp_path, names[0])["rungs"] == ladder["rungs"]  # the JSON reports the record


def test_fallback_prints_the_ladder_with_prices_and_diffs(run_cli, tmp_path):
    result = run_cli(*SPOT_THEN_ON_DEMAND, "--fallback", "1", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    record = _record(tmp_path, "lad")
    spot, on_demand = record["rungs"]
    assert (spot["market"], on_demand["market"]) == ("spot", "on-demand")
    change = Decimal(on_demand["hourly_usd"]) - Decimal(spot["hourly_usd"])
    assert change > 0 and Decimal(on_demand["hourly_change_usd"]) == change
    row = next(line for line in result.stdout.splitlines() if " lad-fb1 " in line)
    assert f"${Decimal(on_demand['hourly_usd']):,.2f}/h" in row and f"+${change:,.2f}" in row
    assert "next: gpuinfra preview lad   then   gpuinfra up lad --fallback" in result.stdout
    # `cost diff` of the two stack files totals the same change
    diff = run_cli("cost", "diff", "lad", "lad-fb1", "--project-dir", str(tmp_path), "--json")
    assert Decimal(json.loads(diff.stdout)["hourly_change_usd"]) == change


def test_every_rung_previews_with_no_rule_violation(run_cli, tmp_path):
    assert run_cli(*H100_PAIR, "--fallback", "3", "--project-dir", str(tmp_path)).exit_code == 0
    for name in ("aws-8xh100-2n", "aws-8xh100-2n-fb1", "aws-8xh100-2n-fb2", "aws-8xh100-2n-fb3"):
        preview = run_cli("preview", name, "--project-dir", str(tmp_path), "--json")
        assert preview.exit_code == 0, preview.stderr
        doc = json.loads(preview.stdout)
        assert doc["stack"] == name and doc["violations"] == [] and doc["resources"]


def test_max_price_per_hour_cuts_the_ladder_at_new(run_cli, tmp_path):
    result = run_cli(
        *SPOT_THEN_ON_DEMAND, "--fallback", "1", "--max-price-per-hour", "108", "--project-dir", str(tmp_path)
    )
    assert result.exit_code == 0, result.stderr
    assert [r["stack"] for r in _record(tmp_path, "lad")["rungs"]] == ["lad"]
    assert not (tmp_path / "stacks" / "Pulumi.lad-fb1.yaml").exists()
    assert "passed over aws us-east-1 use1-az1 p5.48xlarge on-demand" in result.stdout
    assert "over --max-price-per-hour 108" in result.stdout


def test_a_stockout_on_rung_0_forms_rung_1(run_cli, tmp_path, monkeypatch):
    assert run_cli(*H100_PAIR, "--name", "train", "--fallback", "2", "--project-dir", str(tmp_path)).exit_code == 0
    _with_aws_credentials(monkeypatch)
    backend = StockoutBackend({"train": CapacityError("the EC2 Fleet launched 0 of 2 p5.48xlarge instances")})
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--fallback", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    ups = [c for c in backend.calls if c[0] in ("up", "destroy")]
    assert ups == [("up", "train"), ("destroy", "train"), ("up", "train-fb1")]  # rung 0 cleaned up before rung 1
    assert backend.deployed == {"train-fb1"}
    assert "formed rung 1: train-fb1" in result.stdout
    assert "rung 0 train: no capacity (the EC2 Fleet launched 0 of 2" in result.stdout
    record = _record(tmp_path, "train")
    assert record["formed"]["stack"] == "train-fb1" and record["formed"]["rung"] == 1
    assert [a["stack"] for a in record["attempts"]] == ["train", "train-fb1"]
    assert record["attempts"][1]["outcome"] == "formed"
    assert read_stack_spec(tmp_path, "train-fb1").deployment_id  # deployed as a new deployment
    # a second `up --fallback` updates the formed rung and creates nothing next to it
    backend.calls.clear()
    again = run_cli("up", "train", "--fallback", "--project-dir", str(tmp_path))
    assert again.exit_code == 0, again.stderr
    assert [c for c in backend.calls if c[0] == "up"] == [("up", "train-fb1")]


def test_a_failure_other_than_capacity_stops_the_ladder_with_its_exit_code(run_cli, tmp_path, monkeypatch):
    assert run_cli(*H100_PAIR, "--name", "train", "--fallback", "2", "--project-dir", str(tmp_path)).exit_code == 0
    _with_aws_credentials(monkeypatch)
    expired = MissingDependencyError("cloud credentials for stack 'train' are expired: log in again")
    backend = StockoutBackend({"train": expired})
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--fallback", "--project-dir", str(tmp_path))
    assert result.exit_code == 6
    assert result.stderr == f"error: {expired}\n"
    assert [c for c in backend.calls if c[0] in ("up", "destroy")] == [("up", "train")]
    record = _record(tmp_path, "train")
    assert record["formed"] is None and record["attempts"][0]["outcome"].startswith("failed (exit 6)")


def test_every_rung_out_of_capacity_is_exit_7_naming_each(run_cli, tmp_path, monkeypatch):
    assert run_cli(*H100_PAIR, "--name", "train", "--fallback", "1", "--project-dir", str(tmp_path)).exit_code == 0
    _with_aws_credentials(monkeypatch)
    backend = StockoutBackend({s: CapacityError(f"launched 0 of 2 for {s}") for s in ("train", "train-fb1")})
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--fallback", "--project-dir", str(tmp_path))
    assert result.exit_code == 7
    assert "no rung of ladder train formed" in result.stderr and "for train-fb1" in result.stderr
    assert backend.deployed == set()
    assert [c[1] for c in backend.calls if c[0] == "destroy"] == ["train", "train-fb1"]


def test_max_price_per_hour_stops_the_ladder_at_up(run_cli, tmp_path, monkeypatch):
    assert run_cli(*SPOT_THEN_ON_DEMAND, "--fallback", "1", "--project-dir", str(tmp_path)).exit_code == 0
    _with_aws_credentials(monkeypatch)
    backend = StockoutBackend({"lad": CapacityError("the EC2 Fleet launched 0 of 2 p5.48xlarge instances")})
    _use(monkeypatch, backend)
    record = _record(tmp_path, "lad")
    between = (Decimal(record["rungs"][0]["hourly_usd"]) + Decimal(record["rungs"][1]["hourly_usd"])) / 2
    result = run_cli(
        "up", "lad", "--fallback", "--max-price-per-hour", f"{between:.2f}", "--project-dir", str(tmp_path)
    )
    assert result.exit_code == 7
    assert [c for c in backend.calls if c[0] == "up"] == [("up", "lad")]  # the on-demand rung is never tried
    assert "rung 1 lad-fb1 costs $" in result.stdout and "the ladder stops here" in result.stdout
    # a budget under the first rung tries nothing
    backend.calls.clear()
    low = run_cli("up", "lad", "--fallback", "--max-price-per-hour", "1", "--project-dir", str(tmp_path))
    assert low.exit_code == 2 and "nothing was tried" in low.stderr
    assert [c for c in backend.calls if c[0] == "up"] == []


def test_a_ladder_of_no_alternatives_is_a_plain_up(run_cli, tmp_path, monkeypatch):
    assert run_cli(*H100_PAIR, "--name", "solo", "--fallback", "0", "--project-dir", str(tmp_path)).exit_code == 0
    assert [r["stack"] for r in _record(tmp_path, "solo")["rungs"]] == ["solo"]
    _with_aws_credentials(monkeypatch)
    stockout = CapacityError("the EC2 Fleet launched 0 of 2 p5.48xlarge instances in use1-az1")
    results = []
    for args in (("up", "solo"), ("up", "solo", "--fallback")):
        backend = StockoutBackend({"solo": stockout})
        _use(monkeypatch, backend)
        results.append(run_cli(*args, "--project-dir", str(tmp_path)))
        assert [c for c in backend.calls if c[0] in ("up", "destroy")] == [("up", "solo"), ("destroy", "solo")]
    plain, ladder = results
    assert plain.exit_code == ladder.exit_code == 7
    assert ladder.stderr == plain.stderr


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch, interrupt):
    from gpuinfra import fsutil
    from gpuinfra.newstack import NewStackRequest
    from gpuinfra.planner import PlanRequest
    from gpuinfra.services.ladder import write_ladder

    real = fsutil.atomic_write_text
    written: list[Path] = []

    def fail_on_the_fifth(path, text, *, exclusive=False):
        if len(written) == 4:  # Pulumi.yaml, program/__main__.py and two of the three stack files
            raise interrupt
        written.append(Path(path))
        real(path, text, exclusive=exclusive)

    monkeypatch.setattr(fsutil, "atomic_write_text", fail_on_the_fifth)
    request = NewStackRequest(PlanRequest(gpus="8xH100", nodes=2, name="train"))
    with pytest.raises((KeyboardInterrupt, Exception)) as raised:
        write_ladder(request, tmp_path, 2)
    assert isinstance(raised.value, KeyboardInterrupt) or "No space left" in str(raised.value)
    assert [p.name for p in written][-1] == "Pulumi.train-fb1.yaml"  # it did get that far
    assert list(tmp_path.rglob("*")) == []


def test_a_replaced_ladder_gets_its_old_files_back_when_interrupted(run_cli, tmp_path, monkeypatch):
    assert run_cli(*H100_PAIR, "--name", "train", "--fallback", "1", "--project-dir", str(tmp_path)).exit_code == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    from gpuinfra import fsutil

    real = fsutil.atomic_write_text
    calls = []

    def fail_on_the_record(path, text, *, exclusive=False):
        calls.append(Path(path).name)
        if Path(path).parent.name == "ladders" and len(calls) == 3:
            raise KeyboardInterrupt
        real(path, text, exclusive=exclusive)

    monkeypatch.setattr(fsutil, "atomic_write_text", fail_on_the_record)
    interrupted = run_cli(*H100_PAIR, "--name", "train", "--fallback", "1", "--force", "--project-dir", str(tmp_path))
    assert interrupted.exit_code == 130
    assert calls[:2] == ["Pulumi.train.yaml", "Pulumi.train-fb1.yaml"]
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_taken_rung_name_is_refused_before_anything_is_planned(run_cli, tmp_path):
    assert run_cli(*H100_PAIR, "--name", "train-fb2", "--project-dir", str(tmp_path)).exit_code == 0
    result = run_cli(*H100_PAIR, "--name", "train", "--fallback", "2", "--project-dir", str(tmp_path))
    assert result.exit_code == 5 and "Pulumi.train-fb2.yaml already exists" in result.stderr
    assert sorted(p.name for p in (tmp_path / "stacks").iterdir()) == ["Pulumi.train-fb2.yaml"]
    assert not (tmp_path / "ladders").exists()


def test_a_name_too_long_for_its_rungs_says_how_long_it_may_be(run_cli, tmp_path):
    name = "a" * 25  # a valid stack name; its rung "-fb1" makes 29 characters
    result = run_cli(*H100_PAIR, "--name", name, "--fallback", "1", "--project-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "use a --name of at most 23 characters" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_up_fallback_of_an_unknown_stack_and_a_bad_budget(run_cli, tmp_path, monkeypatch):
    assert run_cli(*H100_PAIR, "--name", "train", "--fallback", "1", "--project-dir", str(tmp_path)).exit_code == 0
    _with_aws_credentials(monkeypatch)
    backend = StockoutBackend({})
    _use(monkeypatch, backend)
    unknown = run_cli("up", "nope", "--fallback", "--project-dir", str(tmp_path))
    assert unknown.exit_code == 2 and "no stack 'nope'" in unknown.stderr
    bad = run_cli("up", "train", "--fallback", "--max-price-per-hour", "-3", "--project-dir", str(tmp_path))
    assert bad.exit_code == 2 and "--max-price-per-hour must be a positive USD amount" in bad.stderr
    assert [c for c in backend.calls if c[0] == "up"] == []


def test_a_rung_on_the_other_cloud_needs_its_credentials_only_when_tried(run_cli, tmp_path, monkeypatch):
    # spot 8xH100 pairs: eu-north-1 on AWS, then GCP's europe-north1 (the next region of the
    # catalog's spot ranking; AWS eu-north-1's other zones come after every other region)
    result = run_cli(*H100_PAIR, "--spot", "--name", "h", "--fallback", "3", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    rungs = _record(tmp_path, "h")["rungs"]
    assert [(r["cloud"], r["region"]) for r in rungs] == [
        ("aws", "eu-north-1"),
        ("gcp", "europe-north1"),
        ("aws", "us-east-2"),
        ("aws", "us-west-2"),
    ]
    _with_aws_credentials(monkeypatch)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    backend = StockoutBackend({"h": CapacityError("launched 0 of 2 for h")})
    _use(monkeypatch, backend)
    up = run_cli("up", "h", "--fallback", "--project-dir", str(tmp_path))
    assert up.exit_code == 6, up.stderr  # no GCP credentials: not a capacity failure, so the ladder stops
    assert [c[1] for c in backend.calls if c[0] == "up"] == ["h"]
    assert _record(tmp_path, "h")["attempts"][-1]["outcome"].startswith("failed (exit 6)")


# --- the preflight of each rung ----------------------------------------------------------------

P5_VCPUS = 192  # p5.48xlarge: 192 vCPUs (the catalog's figure; EC2 DescribeInstanceTypes DefaultVCpus)


def test_a_rung_short_of_quota_is_skipped_and_the_next_region_forms(run_cli, tmp_path, monkeypatch, aws):  # noqa: F811
    # EC2 / CloudWatch on moto (96 P on-demand vCPUs in use in us-east-1 only), Service Quotas
    # stand-in; the real preflight through boto3
    enough = aws(p_on_demand=10_000)
    made = run_cli(*H100_PAIR, "--name", "train", "--fallback", "2", "--project-dir", str(tmp_path))
    assert made.exit_code == 0, made.stderr
    assert [r["region"] for r in _record(tmp_path, "train")["rungs"]] == ["us-east-1", "us-east-2", "us-west-2"]
    # `new` preflights the chosen stack only: one quota listing, for rung 0
    assert len(enough.requests) == 1
    assert "preflight: quota Running On-Demand P instances (L-417A185B): 96 in use + 384 vCPUs" in made.stderr
    # 400 vCPUs granted: us-east-1 needs 2 x 192 more on top of its 96 (480); us-east-2 runs nothing
    aws(p_on_demand=400)
    backend = StockoutBackend({})
    _use(monkeypatch, backend)
    up = run_cli("up", "train", "--fallback", "--project-dir", str(tmp_path))
    assert up.exit_code == 0, up.stderr
    assert [c for c in backend.calls if c[0] in ("up", "destroy")] == [("up", "train-fb1")]  # rung 0: nothing created
    assert (
        "rung 0 train: skipped, quota Running On-Demand P instances (L-417A185B) in us-east-1: the cluster needs "
        f"{2 * P5_VCPUS} vCPUs (2 x p5.48xlarge x {P5_VCPUS}), 96 in use, 400 granted; ask for at least 480"
    ) in up.stdout
    assert "formed rung 1: train-fb1" in up.stdout
    assert "rung 1 train-fb1: preflight: EC2 offers p5.48xlarge in use2-az1" in up.stderr
    record = _record(tmp_path, "train")
    assert record["attempts"][0]["outcome"].startswith("skipped by preflight (exit 9): quota Running On-Demand P")
    assert record["formed"]["stack"] == "train-fb1"


def test_new_writes_the_ladder_when_rung_0_is_short_of_quota_and_a_plain_new_refuses(
    run_cli,
    tmp_path,
    monkeypatch,
    aws,  # noqa: F811
):
    # 400 vCPUs granted, 96 in use in us-east-1: rung 0 (2 x p5.48xlarge = 384 vCPUs) falls short
    aws(p_on_demand=400)
    plain = run_cli(*H100_PAIR, "--name", "solo", "--project-dir", str(tmp_path))
    assert plain.exit_code == 9 and "ask for at least 480" in plain.stderr
    assert not (tmp_path / "stacks" / "Pulumi.solo.yaml").exists()
    made = run_cli(*H100_PAIR, "--name", "train", "--fallback", "2", "--project-dir", str(tmp_path))
    assert made.exit_code == 0, made.stderr
    assert (
        "preflight: refused (exit 9): quota Running On-Demand P instances (L-417A185B) in us-east-1: the cluster "
        f"needs {2 * P5_VCPUS} vCPUs"
    ) in made.stderr
    assert [r["region"] for r in _record(tmp_path, "train")["rungs"]] == ["us-east-1", "us-east-2", "us-west-2"]
    assert (tmp_path / "stacks" / "Pulumi.train.yaml").exists() and (
        tmp_path / "stacks" / "Pulumi.train-fb2.yaml"
    ).exists()


def _refusing_preflight(monkeypatch, refusals: dict[str, Exception]) -> None:
    """The preflight answers for the stack files' zones: an error to raise, or a pass."""
    from gpuinfra import preflight

    def check(spec, catalog):
        if spec.zone in refusals:
            raise refusals[spec.zone]
        return [f"{spec.zone}: enough"]

    monkeypatch.setattr(preflight, "CHECKS", {"aws": check, "gcp": check})


SHORT = QuotaError("quota Running On-Demand P instances (L-417A185B) in us-east-1: the cluster needs 384 vCPUs")
ABSENT = NotOfferedError("EC2 does not offer p5.48xlarge in use2-az1 (us-east-2) (DescribeInstanceTypeOfferings)")


@pytest.mark.parametrize(
    ("preflight", "launch", "code"),
    [
        # every rung refused before anything was created, one for quota: ask for quota
        ({"use1-az1": SHORT, "use2-az1": ABSENT}, {}, 9),
        # a rung out of capacity: capacity is what failed, waiting or another ladder may help
        ({"use2-az1": SHORT}, {"train": CapacityError("launched 0 of 2")}, 7),
        ({"use1-az1": SHORT}, {"train-fb1": CapacityError("launched 0 of 2")}, 7),
        # no zone tried offers the type
        ({"use1-az1": ABSENT, "use2-az1": ABSENT}, {}, 4),
    ],
)
def test_no_rung_formed_exits_7_for_capacity_else_9_for_quota_else_4(
    run_cli, tmp_path, monkeypatch, preflight, launch, code
):
    assert run_cli(*H100_PAIR, "--name", "train", "--fallback", "1", "--project-dir", str(tmp_path)).exit_code == 0
    _with_aws_credentials(monkeypatch)
    _refusing_preflight(monkeypatch, preflight)
    backend = StockoutBackend(launch)
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--fallback", "--project-dir", str(tmp_path))
    assert result.exit_code == code, result.stderr
    assert "no rung of ladder train formed" in result.stderr
    refused = {"use1-az1": "train", "use2-az1": "train-fb1"}
    # a rung the preflight refused is never created; the others are, and destroyed again
    assert [c[1] for c in backend.calls if c[0] == "up"] == [s for z, s in refused.items() if z not in preflight]
    assert backend.deployed == set()
    outcomes = [a["outcome"] for a in _record(tmp_path, "train")["attempts"]]
    assert len(outcomes) == 2
    for zone, stack in refused.items():
        if zone in preflight:
            assert f"rung {list(refused).index(zone)} {stack}: skipped, {preflight[zone]}" in result.stdout


def test_a_quota_error_at_launch_stops_the_ladder_with_exit_9(run_cli, tmp_path, monkeypatch):
    assert run_cli(*H100_PAIR, "--name", "train", "--fallback", "1", "--project-dir", str(tmp_path)).exit_code == 0
    _with_aws_credentials(monkeypatch)
    _refusing_preflight(monkeypatch, {})  # the preflight passes; EC2 then refuses the fleet
    refused = QuotaError("the EC2 Fleet launched 0 of 2: VcpuLimitExceeded: You have requested more vCPU capacity")
    backend = StockoutBackend({"train": refused})
    _use(monkeypatch, backend)
    result = run_cli("up", "train", "--fallback", "--project-dir", str(tmp_path))
    assert result.exit_code == 9, result.stderr
    # created, destroyed again, and no other rung tried: another region's quota is another request
    assert [c for c in backend.calls if c[0] in ("up", "destroy")] == [("up", "train"), ("destroy", "train")]
    assert _record(tmp_path, "train")["attempts"][0]["outcome"].startswith("failed (exit 9)")


def test_a_plain_up_through_the_budget_check_keeps_the_preflight_error(run_cli, tmp_path, monkeypatch):
    assert run_cli(*H100_PAIR, "--name", "solo", "--project-dir", str(tmp_path)).exit_code == 0
    _with_aws_credentials(monkeypatch)
    _refusing_preflight(monkeypatch, {"use1-az1": SHORT})
    backend = StockoutBackend({})
    _use(monkeypatch, backend)
    plain = run_cli("up", "solo", "--project-dir", str(tmp_path))
    budgeted = run_cli("up", "solo", "--max-price-per-hour", "1000", "--project-dir", str(tmp_path))
    assert plain.exit_code == budgeted.exit_code == 9
    assert plain.stderr == budgeted.stderr == f"error: {SHORT}\n"
    assert [c for c in backend.calls if c[0] == "up"] == []


@pytest.mark.parametrize("asked", ["11", "1000", "-1"])
def test_a_fallback_out_of_bounds_is_refused_with_nothing_written(run_cli, tmp_path, asked):
    result = run_cli(*H100_PAIR, "--fallback", asked, "--project-dir", str(tmp_path))
    assert result.exit_code == 2, result.stderr
    assert f"--fallback takes 0 to 10 alternatives, got {asked}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not tmp_path.exists() or not any(tmp_path.rglob("*")), list(tmp_path.rglob("*"))


def test_the_fallback_bound_is_the_one_new_help_and_docs_state(run_cli):
    from gpuinfra.services.ladder import MAX_FALLBACK_ALTERNATIVES

    help_text = " ".join(run_cli("new", "--help").stdout.split())
    assert f"0 to {MAX_FALLBACK_ALTERNATIVES}" in help_text
    assert f"`--fallback` takes 0 to {MAX_FALLBACK_ALTERNATIVES} alternatives" in Path("docs/capacity.md").read_text()
