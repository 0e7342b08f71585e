"""Error types and the CLI's documented exit codes.

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
"""

from __future__ import annotations

from enum import IntEnum


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


class GpuinfraError(Exception):
    """Base class of all expected gpuinfra errors.

    Args:
        message: one line saying what was wrong and what is allowed.
    """

    exit_code: ExitCode = ExitCode.BAD_INPUT


class RequestError(GpuinfraError):
    """A GPU request (``--gpus``/``--nodes``) is malformed or names an unknown GPU."""


class CatalogError(GpuinfraError):
    """The catalog is missing, corrupt, or a region/zone/instance type is unknown to it."""


class NoOfferError(GpuinfraError):
    """No catalog offer satisfies the request and its filters."""

    exit_code = ExitCode.NO_OFFER


class PriceMissingError(NoOfferError):
    """A cost total would need a price the catalog or price table lacks (exit 4): money fails
    closed, so an unpriced line is never counted as $0.

    Args:
        missing: one description per unpriced line (``resource: component (source)``).
    """

    def __init__(self, missing: list[str]):
        self.missing = list(missing)
        super().__init__(f"price-known: no price for {'; '.join(self.missing)}; the total would leave "
                         "it out, so no total is given")


class SpecError(GpuinfraError):
    """A cluster spec (stack config ``gpuinfra:cluster``) is invalid."""


class ProjectDirError(GpuinfraError):
    """``--project-dir`` is not a folder gpuinfra can write (not a folder, no permission, a
    read-only file system); whatever the command had begun to write is removed again (exit 2)."""


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
    capacity for all of them); exit 7."""
