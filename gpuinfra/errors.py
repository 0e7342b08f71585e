"""Error types and the CLI's documented exit codes: every error class of gpuinfra lives here.

Every expected failure in gpuinfra raises a subclass of :class:`GpuinfraError`. The CLI
catches it, prints ``error: <message>`` on one line to stderr and exits with the error's
``exit_code``; no traceback is shown unless ``GPUINFRA_DEBUG=1``.

Exit codes (stable, documented in README.md):

* 0 -- success
* 1 -- unexpected internal error (a bug: please report it)
* 2 -- bad input: a flag, GPU spec, region, zone, stack name or config value is invalid, or the
  ``--project-dir`` folder cannot be written (nothing is written then)
* 3 -- budget exceeded (``gpuinfra cost --budget``)
* 4 -- no offer in the catalog fits the request, or a price the total needs is missing
* 5 -- refusing to overwrite an existing file (use ``--force``)
* 6 -- a required external tool or credential is missing or expired (Pulumi CLI, cloud credentials)
* 7 -- a Pulumi operation failed or could not start (stack locked by another update, engine error)
* 8 -- a node failed its boot health gate, or its result is unreadable or missing (``gpuinfra check``)
* 9 -- a cloud quota is too small for the cluster: the preflight of ``new`` / ``up`` found a
  shortfall before anything was created, or EC2 refused the launch with a quota error
* 10 -- the cloud refused the launch's parameters (EC2 Fleet: an invalid parameter, an unsupported
  configuration, or an error gpuinfra does not classify); nothing is retried elsewhere
* 11 -- the cloud refused the launch for permissions (EC2 Fleet: ``UnauthorizedOperation``, or an
  instance profile still not usable after the propagation retries)

Classes and their exit codes (a subclass keeps its base's code unless listed):

==========================  ====  =========================================================
class                       exit  raised for
==========================  ====  =========================================================
GpuinfraError               2     base class (bad input unless a subclass says otherwise)
RequestError                2     a malformed GPU request or flag value
CatalogError                2     missing/corrupt catalog; unknown region, zone or type
CatalogGateError            2     a built or refreshed catalog fails a sanity gate
DataSourceError             2     ``--data`` / ``--data-region`` / ``--data-size``
ProfileError                2     unknown profile, invalid profile file or folder
SizingError                 2     ``gpuinfra size`` / ``new --model`` input
BakeError                   2     ``gpuinfra image bake`` / ``image record`` / ``new --image`` input
SpecError                   2     an invalid stack spec (``gpuinfra:cluster``)
RuleViolationError          2     a spec or preview breaks a cloud rule (one line each)
PreviewFileError            2     ``cost --from-preview`` file is not preview JSON
UsageError                  2     ``cost --usage`` file
ProjectDirError             2     ``--project-dir`` cannot be written
BudgetExceededError         3     ``cost --budget``: the run total is over the budget
NoOfferError                4     no catalog offer fits the request
PriceMissingError           4     a total would need a price nobody has
FileExistsGpuinfraError     5     a file would be overwritten without ``--force``
MissingDependencyError      6     Pulumi CLI, client library or credentials missing
OperationError              7     a Pulumi operation failed
CapacityError               7     the cloud launched fewer nodes than the cluster needs
QuotaError                  9     a quota is too small (preflight shortfall, or EC2's quota error)
LaunchRejectedError         10    the cloud refused the launch's parameters
LaunchDeniedError           11    the cloud refused the launch for permissions (IAM)
InstanceProfileNotReady     11    the new instance profile is not usable yet (``up`` retries it)
NotOfferedError             4     the cloud does not offer the type / accelerator in the zone
HealthGateError             8     a node failed its boot health gate (``gpuinfra check``)
==========================  ====  =========================================================

Node-side errors (the boot health gate on the nodes, never shown by the CLI; ``OSError``
subclasses, as the bucket CLI failures they stand for):

==========================  =========================================================
PreconditionFailed          a create-only write found its key taken (S3 / GCS 412)
RankDecisionError           no rank decision could be stored or read (``peers`` exits 5)
==========================  =========================================================

A programming error, never caused by user input (the spec validation refuses what could cause it),
and so shown as a bug (exit 1):

==========================  =========================================================
UnitValueError              a value that cannot go into a systemd unit, a node file path or
                            the boot steps (:mod:`gpuinfra.plan.units`, :mod:`gpuinfra.plan.boot`)
==========================  =========================================================

This module imports nothing from the rest of gpuinfra (standard library only), so any module
can import it, the node modules shipped in the node bundle too.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from enum import IntEnum
from typing import Protocol


class ExitCode(IntEnum):
    """Process exit codes of the ``gpuinfra`` CLI (see module docstring)."""

    OK = 0
    INTERNAL = 1
    BAD_INPUT = 2
    BUDGET_EXCEEDED = 3
    NO_OFFER = 4
    FILE_EXISTS = 5
    MISSING_DEPENDENCY = 6
    OPERATION_FAILED = 7
    HEALTH_FAILED = 8
    QUOTA_EXCEEDED = 9
    LAUNCH_REJECTED = 10
    LAUNCH_DENIED = 11


class GpuinfraError(Exception):
    """Base class of all expected gpuinfra errors.

    Args:
        message: one line saying what was wrong and what is allowed.
    """

    exit_code: ExitCode = ExitCode.BAD_INPUT
    #: Launch failures only (:data:`LAUNCH_ERRORS`): the text that starts the error's line in
    #: Pulumi's output, where ``gpuinfra up`` finds it.
    marker: str = ""


class RequestError(GpuinfraError):
    """A GPU request (``--gpus``/``--nodes``) is malformed or names an unknown GPU."""


class CatalogError(GpuinfraError):
    """The catalog is missing, corrupt, or a region/zone/instance type is unknown to it."""


class CatalogGateError(CatalogError):
    """A catalog failed a sanity gate (:mod:`gpuinfra.catalog.gates`); it was not written (exit 2).

    Args:
        failures: one line per failing offer and gate; the message shows the first five.

    Attributes:
        failures: every failure line.
    """

    def __init__(self, failures: list[str]):
        self.failures = list(failures)
        shown = "; ".join(self.failures[:5])
        more = f" (and {len(self.failures) - 5} more)" if len(self.failures) > 5 else ""
        super().__init__(f"catalog failed {len(self.failures)} sanity gate check(s), nothing written: {shown}{more}")


class DataSourceError(GpuinfraError):
    """A ``--data`` / ``--data-region`` / ``--data-size`` value is malformed or cannot be resolved (exit 2)."""


class ProfileError(GpuinfraError):
    """A profile name is unknown or a profile file is invalid (exit 2)."""


class SizingError(GpuinfraError):
    """Bad sizing input (unknown model, malformed parameter count, impossible setting; exit 2)."""


class BakeError(GpuinfraError):
    """Bad ``gpuinfra image bake`` / ``image record`` / ``new --image`` input (exit 2)."""


class PreviewFileError(GpuinfraError):
    """The ``cost --from-preview`` file is not a `pulumi preview --json` document (exit 2)."""


class UsageError(GpuinfraError):
    """A usage file is unreadable or has unknown keys / negative values (exit 2)."""


class NoOfferError(GpuinfraError):
    """No catalog offer satisfies the request and its filters.

    Args:
        reason: what fits nothing, and why.
        advice: what the user can do about it ("" for nothing); the message is
            ``<reason>; <advice>``.

    Attributes:
        reason, advice: as given (a caller that plans on the user's behalf, such as
            ``gpuinfra new --model``, reports the reason without advice the user cannot take).
    """

    exit_code = ExitCode.NO_OFFER

    def __init__(self, reason: str, advice: str = ""):
        self.reason, self.advice = reason, advice
        super().__init__(f"{reason}; {advice}" if advice else reason)


class PriceMissingError(NoOfferError):
    """A cost total would need a price the catalog or price table lacks (exit 4): money fails
    closed, so an unpriced line is never counted as $0.

    Args:
        missing: one description per unpriced line (``resource: component (source)``).
        advice: how to fill them, if known (appended after "; ").
    """

    def __init__(self, missing: list[str], advice: str = ""):
        self.missing = list(missing)
        super().__init__(
            f"price-known: no price for {'; '.join(self.missing)}; the total would leave it out, so no total is given",
            advice,
        )


class SpecError(GpuinfraError):
    """A cluster spec (stack config ``gpuinfra:cluster``) is invalid."""


class _Broken(Protocol):
    """What :class:`RuleViolationError` needs of a violation (:class:`gpuinfra.rules.model.Violation`)."""

    def line(self) -> str:
        """``<rule>: <resource>: <what> (source: <page>)``."""
        ...


class RuleViolationError(SpecError):
    """A spec or a preview breaks cloud rules; the message has one line per violation (exit 2).

    Args:
        violations: what broke, with rule names and sources
            (:class:`gpuinfra.rules.model.Violation` objects; anything with a ``line()`` method).

    Attributes:
        violations: the violations, in the order given.
    """

    def __init__(self, violations: Iterable[_Broken]):
        self.violations = list(violations)
        super().__init__("\n".join(v.line() for v in self.violations))


class ProjectDirError(GpuinfraError):
    """``--project-dir`` is not a folder gpuinfra can write (not a folder, no permission, a
    read-only file system); whatever the command had begun to write is removed again (exit 2)."""


class BudgetExceededError(GpuinfraError):
    """A run total is over the budget the user gave (``gpuinfra cost --budget``; exit 3).

    Args:
        run_usd: the stack's run total in USD.
        budget_usd: the budget in USD.
    """

    exit_code = ExitCode.BUDGET_EXCEEDED

    def __init__(self, run_usd: Decimal, budget_usd: Decimal):
        self.run_usd = run_usd
        self.budget_usd = budget_usd
        super().__init__(f"run total ${run_usd:,.2f} exceeds the budget ${budget_usd:,.2f}")


class FileExistsGpuinfraError(GpuinfraError):
    """A file would be overwritten without ``--force``."""

    exit_code = ExitCode.FILE_EXISTS


class MissingDependencyError(GpuinfraError):
    """An external tool or credential needed for the command is not available."""

    exit_code = ExitCode.MISSING_DEPENDENCY


class OperationError(GpuinfraError):
    """A Pulumi operation failed (stack locked, engine or provider error)."""

    exit_code = ExitCode.OPERATION_FAILED


#: Marker the AWS program puts in front of a capacity failure; ``gpuinfra up`` finds it in
#: Pulumi's output (the program's exception text) and cleans up (:mod:`gpuinfra.lifecycle`).
CAPACITY_ERROR_MARKER = "gpuinfra-capacity:"


class CapacityError(OperationError):
    """The cloud launched fewer nodes than the cluster needs (an instant EC2 Fleet that found no
    capacity for all of them); exit 7. The only launch failure another zone, region or market
    can cure: ``up --fallback`` moves to the next rung on it alone."""

    marker = CAPACITY_ERROR_MARKER


class NotOfferedError(NoOfferError):
    """The cloud does not offer the instance type (EC2 ``DescribeInstanceTypeOfferings``) or the
    accelerator type (Compute ``acceleratorTypes.get``) in the stack's zone (exit 4)."""


class QuotaError(GpuinfraError):
    """A cloud quota is too small for the cluster (exit 9): the preflight found a shortfall before
    anything was created (the message names the quota, what is needed, what is granted and how to
    ask for more), or EC2 refused the launch with a quota error (``VcpuLimitExceeded``,
    ``MaxSpotInstanceCountExceeded``, ``InstanceLimitExceeded``)."""

    exit_code = ExitCode.QUOTA_EXCEEDED
    marker = "gpuinfra-quota:"


class LaunchRejectedError(GpuinfraError):
    """The cloud refused the launch's parameters (exit 10): EC2 Fleet errors such as
    ``InvalidParameterValue``, ``InvalidParameterCombination``, ``Unsupported``,
    ``InvalidBlockDeviceMapping``, or an error gpuinfra does not classify (the message quotes it)."""

    exit_code = ExitCode.LAUNCH_REJECTED
    marker = "gpuinfra-launch-rejected:"


class LaunchDeniedError(GpuinfraError):
    """The cloud refused the launch for permissions (exit 11): ``UnauthorizedOperation`` /
    ``AuthFailure``, or an instance profile EC2 still calls invalid after the propagation retries."""

    exit_code = ExitCode.LAUNCH_DENIED
    marker = "gpuinfra-launch-denied:"


class InstanceProfileNotReady(LaunchDeniedError):
    """EC2 refused the launch with ``Invalid IAM Instance Profile``: a just-created instance profile
    has not propagated yet (exit 11 once ``up``'s bounded retries are spent)."""

    marker = "gpuinfra-profile-not-ready:"


#: Launch failures the cluster program reports (each class's ``marker`` starts its line in
#: Pulumi's output); ``up`` destroys a stack that did not exist before on any of them. The most
#: specific class comes first (a marker search takes the first that matches).
LAUNCH_ERRORS: tuple[type[GpuinfraError], ...] = (
    InstanceProfileNotReady,
    LaunchDeniedError,
    LaunchRejectedError,
    QuotaError,
    CapacityError,
)


class HealthGateError(GpuinfraError):
    """A node failed its boot health gate, a result is unreadable, or none exists yet (exit 8)."""

    exit_code = ExitCode.HEALTH_FAILED


class PreconditionFailed(OSError):
    """A create-only write found the key taken: S3 / GCS answered 412 Precondition Failed
    (:meth:`gpuinfra.health.node.Bucket.put_new`)."""


class RankDecisionError(OSError):
    """No rank decision could be stored or read (:func:`gpuinfra.health.ranks.settle`); the node
    must not rank with its own."""


class UnitValueError(ValueError):
    """A value that cannot go into a unit file, a node file path or a boot step (a programming
    error: the spec validation refuses user input that could cause it)."""
