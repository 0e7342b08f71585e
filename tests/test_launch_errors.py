"""Instant EC2 Fleet launch errors: read with DescribeFleets through the real boto3 client from a
local stand-in answering in EC2's XML, classified into capacity (exit 7), quota (9), invalid
parameter (10) and IAM (11); `up` destroys a new stack on each and relaunches the fleet while a
new instance profile propagates. Error codes: docs.aws.amazon.com/AWSEC2/latest/APIReference/
errors-overview.html."""

from __future__ import annotations

import boto3
import pytest

from gpuinfra import lifecycle
from gpuinfra.errors import (
    CapacityError,
    InstanceProfileNotReady,
    LaunchDeniedError,
    LaunchRejectedError,
    OperationError,
    QuotaError,
)
from gpuinfra.launch_errors import (
    PROFILE_RETRY_SECONDS,
    PROFILE_RETRY_WAIT_SECONDS,
    FleetError,
    describe_fleet_errors,
    fleet_launch_error,
    launch_error,
)
from gpuinfra.lifecycle import FLEET_TYPE, deploy, launch_failure
from tests.blueprints.helpers import make_spec
from tests.replay_server import ReplayServer

# EC2's messages as users report them for these codes
MESSAGES = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient p4d.24xlarge capacity in the Availability "
    "Zone you requested (us-east-1a). Our system will be working on provisioning additional capacity.",
    "VcpuLimitExceeded": "You have requested more vCPU capacity than your current vCPU limit of 0 allows for the "
    "instance bucket that the specified instance type belongs to.",
    "MaxSpotInstanceCountExceeded": "Max spot instance count exceeded",
    "InvalidParameterValue": "Invalid IAM Instance Profile name",
    "UnauthorizedOperation": "You are not authorized to perform this operation.",
    "InvalidBlockDeviceMapping": "Volume of size 150GB is smaller than snapshot 'snap-0abc', expect size >= 200GB",
    # errors-overview.html's own description of the code (no user report of its message was found)
    "ReservationCapacityExceeded": "The targeted Capacity Reservation does not enough available instance capacity "
    "to fulfill your request.",
    "InvalidParameterCombination": "Network interfaces and an instance-level security groups may not be specified "
    "on the same request",
}


def _describe_fleets_xml(errors: list[tuple[str, str, str]]) -> str:
    """A DescribeFleets answer for an instant fleet that launched nothing (FleetData.Errors =
    ``errorSet``, each ``errorCode`` / ``errorMessage`` / ``lifecycle``)."""
    items = "".join(
        f"<item><errorCode>{code}</errorCode><errorMessage>{message}</errorMessage><lifecycle>{life}</lifecycle></item>"
        for code, message, life in errors
    )
    return (
        '<DescribeFleetsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r-1</requestId>'
        "<fleetSet><item><fleetId>fleet-0123456789abcdef0</fleetId><type>instant</type><fleetState>active</fleetState>"
        f"<errorSet>{items}</errorSet><fleetInstanceSet/></item></fleetSet></DescribeFleetsResponse>"
    )


def _read(errors):
    with ReplayServer([("POST", "/", None, _describe_fleets_xml(errors))]) as server:
        ec2 = boto3.Session(aws_access_key_id="t", aws_secret_access_key="t").client(
            "ec2", region_name="us-east-1", endpoint_url=server.url
        )
        read = describe_fleet_errors(ec2, "fleet-0123456789abcdef0")
        assert b"Action=DescribeFleets" in server.requests[0][3]
        assert b"FleetId.1=fleet-0123456789abcdef0" in server.requests[0][3]
    return read


def _error(errors):
    return launch_error(_read(errors), 0, 2, "p4d.24xlarge", "use1-az1", "us-east-1", "train")


@pytest.mark.parametrize(
    ("code", "cls", "exit_code"),
    [
        ("InsufficientInstanceCapacity", CapacityError, 7),
        ("ReservationCapacityExceeded", CapacityError, 7),  # a full capacity reservation
        ("VcpuLimitExceeded", QuotaError, 9),
        ("MaxSpotInstanceCountExceeded", QuotaError, 9),
        ("InvalidParameterValue", InstanceProfileNotReady, 11),  # "Invalid IAM Instance Profile name"
        ("UnauthorizedOperation", LaunchDeniedError, 11),
        ("InvalidBlockDeviceMapping", LaunchRejectedError, 10),
        ("InvalidParameterCombination", LaunchRejectedError, 10),
    ],
)
def test_each_fleet_error_code_gets_its_class_and_exit_code(code, cls, exit_code):
    error = _error([(code, MESSAGES[code], "on-demand")])
    assert type(error) is cls
    assert error.exit_code == exit_code
    assert str(error).startswith(f"{cls.marker} the EC2 Fleet launched 0 of 2 p4d.24xlarge instances in use1-az1")
    assert f"EC2 said: {code}: {MESSAGES[code]}" in str(error)


def test_only_capacity_is_exit_7():
    codes = [c for c in MESSAGES if _error([(c, MESSAGES[c], "spot")]).exit_code == 7]
    assert codes == ["InsufficientInstanceCapacity", "ReservationCapacityExceeded"]


def test_a_full_capacity_reservation_says_to_grow_or_change_the_reservation():
    error = _error([("ReservationCapacityExceeded", MESSAGES["ReservationCapacityExceeded"], "on-demand")])
    assert "increase the capacity reservation's instance count or target another" in str(error)
    plain = _error([("InsufficientInstanceCapacity", MESSAGES["InsufficientInstanceCapacity"], "on-demand")])
    assert "capacity reservation's instance count" not in str(plain)


def test_a_quota_error_beside_a_capacity_error_is_reported_as_quota():
    # another zone would run into the same quota: only a quota increase helps
    error = _error(
        [
            ("InsufficientInstanceCapacity", MESSAGES["InsufficientInstanceCapacity"], "on-demand"),
            ("VcpuLimitExceeded", MESSAGES["VcpuLimitExceeded"], "on-demand"),
        ]
    )
    assert type(error) is QuotaError
    assert "InsufficientInstanceCapacity" not in str(error)


def test_no_error_at_all_stays_capacity():
    error = _error([])
    assert type(error) is CapacityError and "EC2 reported no error" in str(error)


def test_unreadable_errors_never_count_as_capacity():
    def fail():
        raise RuntimeError("AccessDenied: ec2:DescribeFleets")

    error = fleet_launch_error(fail, 0, 2, "p4d.24xlarge", "use1-az1", "us-east-1", "train", "fleet-0abc")
    assert type(error) is LaunchRejectedError and error.exit_code == 10
    assert "aws ec2 describe-fleets --region us-east-1 --fleet-ids fleet-0abc" in str(error)


def test_the_program_raises_the_classified_error_from_the_fleet_errors():
    from blueprints.aws.nodes import launched_instance_ids

    spec = make_spec("p4d.24xlarge", nodes=2)
    quota = [FleetError("VcpuLimitExceeded", MESSAGES["VcpuLimitExceeded"], "on-demand")]
    with pytest.raises(QuotaError, match="^gpuinfra-quota: the EC2 Fleet launched 0 of 2"):
        launched_instance_ids([], spec, lambda: quota, "fleet-0abc")


@pytest.mark.parametrize(
    "cls", [CapacityError, QuotaError, LaunchRejectedError, LaunchDeniedError, InstanceProfileNotReady]
)
def test_up_finds_each_class_in_pulumis_output(cls):
    text = (
        "error: Program failed with an unhandled exception:\n  File ...\n"
        f"    {cls.__module__}.{cls.__name__}: {cls.marker} the EC2 Fleet launched 0 of 2 p4d.24xlarge instances\n"
    )
    found = launch_failure(text)
    assert type(found) is cls
    assert str(found) == "the EC2 Fleet launched 0 of 2 p4d.24xlarge instances"


# --- deploy: clean-up and the instance profile retry -----------------------------------------


class _Backend:
    """Fails ``up`` with the given errors in turn, then succeeds; records calls."""

    def __init__(self, failures):
        self.failures = list(failures)
        self.calls = []

    def list_stacks(self, project_dir):
        return []

    def pending_creates(self, project_dir, stack):
        return []

    def up(self, project_dir, stack, on_event, replace_types=()):
        self.calls.append(("up", replace_types))
        if self.failures:
            raise self.failures.pop(0)
        return {"create": 30}

    def destroy(self, project_dir, stack, on_event):
        self.calls.append(("destroy", ()))
        return {}


@pytest.fixture
def project(run_cli, tmp_path):
    result = run_cli(
        "new", "--instance-type", "p4d.24xlarge", "--nodes", "2", "--name", "train", "--project-dir", str(tmp_path)
    )
    assert result.exit_code == 0, result.stderr
    from gpuinfra.stackfile import read_stack_spec

    return tmp_path, read_stack_spec(tmp_path, "train")


def test_profile_not_ready_relaunches_only_the_fleet_until_it_works(project):
    project_dir, spec = project
    not_ready = InstanceProfileNotReady("the EC2 Fleet launched 0 of 2 ...; EC2 said: InvalidParameterValue")
    backend, slept, notes = _Backend([not_ready, not_ready]), [], []
    changes = deploy(backend, project_dir, spec, lambda e: None, notes=notes.append, sleep=slept.append)
    assert changes == {"create": 30}
    assert backend.calls == [("up", ()), ("up", (FLEET_TYPE,)), ("up", (FLEET_TYPE,))]
    assert slept == [PROFILE_RETRY_WAIT_SECONDS, PROFILE_RETRY_WAIT_SECONDS]
    assert len([n for n in notes if "instance profile is not usable yet" in n]) == 2


def test_profile_retries_are_bounded_then_the_new_stack_is_destroyed(project):
    project_dir, spec = project
    not_ready = InstanceProfileNotReady("the EC2 Fleet launched 0 of 2 ...")
    backend, slept = _Backend([not_ready] * 100), []
    with pytest.raises(InstanceProfileNotReady) as raised:
        deploy(backend, project_dir, spec, lambda e: None, sleep=slept.append)
    assert sum(slept) == PROFILE_RETRY_SECONDS == 120
    assert len(slept) == PROFILE_RETRY_SECONDS // PROFILE_RETRY_WAIT_SECONDS
    assert backend.calls[-1] == ("destroy", ())
    assert raised.value.exit_code == 11
    assert "still refused after 120 s of relaunches" in str(raised.value)
    assert "Everything `up` created was destroyed again" in str(raised.value)


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [(QuotaError("q"), 9), (LaunchRejectedError("r"), 10), (LaunchDeniedError("d"), 11), (CapacityError("c"), 7)],
)
def test_every_launch_failure_destroys_the_new_stack_and_keeps_its_exit_code(project, error, exit_code):
    project_dir, spec = project
    backend = _Backend([error])
    with pytest.raises(type(error)) as raised:
        deploy(backend, project_dir, spec, lambda e: None, sleep=lambda s: None)
    assert backend.calls == [("up", ()), ("destroy", ())]  # no relaunch: only a profile not ready is retried
    assert raised.value.exit_code == exit_code


def test_launch_failure_cli_exit_code(project, run_cli, monkeypatch):
    project_dir, _ = project
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    backend = _Backend([LaunchRejectedError("the EC2 Fleet launched 0 of 2; EC2 said: InvalidBlockDeviceMapping")])
    monkeypatch.setattr(lifecycle, "make_backend", lambda: backend)
    result = run_cli("up", "train", "--project-dir", str(project_dir))
    assert result.exit_code == 10
    assert result.stderr.startswith("error: the EC2 Fleet launched 0 of 2; EC2 said: InvalidBlockDeviceMapping.")


def test_a_failed_cleanup_is_an_operation_error(project):
    project_dir, spec = project

    class Stuck(_Backend):
        def destroy(self, project_dir, stack, on_event):
            raise OperationError("locked")

    with pytest.raises(OperationError, match="removing the half-created stack failed too"):
        deploy(Stuck([QuotaError("q")]), project_dir, spec, lambda e: None)
