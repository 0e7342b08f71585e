"""The boot health gate's decision and its result document.

Standard library only: a node runs this next to :mod:`gpuinfra.health.parsers` at boot, before
ranks are assigned. The node collects the raw outputs (:class:`GateOutputs`), the deploy step
gives it what its type must show (:class:`Expectations`, built from the catalog facts by
:func:`gpuinfra.health.report.expectations_for`), :func:`decide` turns both into a
:class:`NodeHealth`, which the node uploads as JSON to ``<bucket>/health/<stack>/<node>.json``
(:func:`health_key`) and ``gpuinfra check`` reads back.

Checks, in order (:data:`CHECKS`); each passes (``true``), fails (``false``) or is not checked
for this type (``null``, with the reason); a node passes when no check failed:

* ``gpu_count``: GPUs ``nvidia-smi`` lists == the type's GPU count;
* ``ecc``: no uncorrectable volatile ECC error on any GPU;
* ``nvlink``: no ``<inactive>`` NVLink (types with NVSwitch);
* ``fabric_manager``: ``nvidia-fabricmanager`` is active (types with NVSwitch);
* ``efa_devices``: EFA devices ``fi_info -p efa`` lists == ``EfaInfo.MaximumEfaInterfaces``;
* ``gpudirect_plugin``: NCCL used the type's GPUDirect network plugin (aws-ofi-nccl, TCPX,
  TCPXO, gIB) and did not fall back to sockets (multi-node runs);
* ``allreduce_correct``: ``all_reduce_perf`` found no wrong element;
* ``allreduce_busbw``: out-of-place busbw >= :data:`BUSBW_PASS_FRACTION` x the type's baseline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone

from gpuinfra.health import parsers as p
from gpuinfra.health.baselines import Baseline

SCHEMA_VERSION = "1"
HEALTH_PREFIX = "health"
#: Share of the baseline busbw a node must reach. The baselines come from other clusters and
#: software versions, so the margin is wider than nccl-tests' own ``--check_avg_bw`` (which
#: fails below 0.9 x the given value: NVIDIA/nccl-tests src/util.cu, the ``Avg bus bandwidth``
#: footer).
BUSBW_PASS_FRACTION = 0.8
CHECKS = ("gpu_count", "ecc", "nvlink", "fabric_manager", "efa_devices", "gpudirect_plugin",
          "allreduce_correct", "allreduce_busbw")
ALL_REDUCE_COMMAND = "all_reduce_perf (nccl-tests) with NCCL_DEBUG=INFO"

#: ``nic_layout`` -> (plugin, ``NET/<transport>`` markers, ``Using network`` name prefixes).
#: aws-ofi-nccl logs ``NET/OFI`` (awsome-distributed-training FSDP README, AWS EFA+NCCL guide);
#: GPUDirect-TCPX ``NET/GPUDirectTCPX`` (skypilot examples/gcp_gpu_direct_tcpx/README.md);
#: TCPXO's plugin is FasTrak (container-engine-accelerators gpudirect-tcpxo/README.md, the
#: ``NCCL_FASTRAK_*`` settings); gIB is selected with ``NCCL_NET=gIB`` (cluster-toolkit
#: examples/gke-a3-ultragpu/nccl-jobset-example.yaml) and NCCL logs ``Using network <NCCL_NET>``.
GPUDIRECT_PLUGINS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "efa": ("aws-ofi-nccl (AWS Libfabric)", ("OFI",), ("AWS Libfabric", "Libfabric")),
    "tcpx": ("GPUDirect-TCPX", ("GPUDirectTCPX",), ("GPUDirectTCPX",)),
    "tcpxo": ("GPUDirect-TCPXO (FasTrak)", ("FasTrak",), ("FasTrak",)),
    "gib": ("NCCL/gIB", ("gIB",), ("gIB",)),
}


def health_key(stack: str, node: str) -> str:
    """Object key of a node's result: ``health/<stack>/<node>.json``."""
    return f"{HEALTH_PREFIX}/{stack}/{node}.json"


@dataclass(frozen=True)
class Expectations:
    """What a node of the cluster must show (from the catalog facts and the baseline table).

    Attributes:
        cloud, instance_type: the type.
        nodes: nodes in the cluster (2+: the all-reduce crosses the network).
        gpu_count: GPUs per node.
        efa_count: EFA devices per node (AWS ``EfaInfo.MaximumEfaInterfaces``; 0: none).
        nvswitch: GPUs on NVSwitch (NVLink and fabric manager are checked).
        nic_layout: ``efa`` | ``ena`` | ``gvnic`` | ``tcpx`` | ``tcpxo`` | ``gib``.
        baseline: the busbw baseline for this scope, None when the table has none.
        busbw_pass_fraction: share of the baseline a node must reach.
    """

    cloud: str
    instance_type: str
    nodes: int
    gpu_count: int
    efa_count: int
    nvswitch: bool
    nic_layout: str
    baseline: Baseline | None
    busbw_pass_fraction: float = BUSBW_PASS_FRACTION

    def to_dict(self) -> dict:
        """JSON form (the deploy step writes it for the node)."""
        return {"cloud": self.cloud, "instance_type": self.instance_type, "nodes": self.nodes,
                "gpu_count": self.gpu_count, "efa_count": self.efa_count, "nvswitch": self.nvswitch,
                "nic_layout": self.nic_layout, "baseline": self.baseline.to_dict() if self.baseline else None,
                "busbw_pass_fraction": self.busbw_pass_fraction}

    @classmethod
    def from_dict(cls, data: dict) -> Expectations:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        try:
            return cls(str(data["cloud"]), str(data["instance_type"]), int(data["nodes"]), int(data["gpu_count"]),
                       int(data["efa_count"]), bool(data["nvswitch"]), str(data["nic_layout"]),
                       Baseline.from_dict(data["baseline"]) if data.get("baseline") else None,
                       float(data.get("busbw_pass_fraction", BUSBW_PASS_FRACTION)))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"health expectations are invalid: {exc!r}") from None


@dataclass(frozen=True)
class GateOutputs:
    """Raw text the node collected; None for a command that was not run.

    Attributes:
        nvidia_smi: :data:`~gpuinfra.health.parsers.NVIDIA_SMI_QUERY` output.
        nvlink_status: ``nvidia-smi nvlink -s``.
        fabric_manager: ``systemctl is-active nvidia-fabricmanager``.
        fi_info: ``fi_info -p efa``.
        all_reduce: ``all_reduce_perf`` stdout+stderr (rank 0), run with ``NCCL_DEBUG=INFO``.
        nccl_log: where NCCL's INFO lines are when not in ``all_reduce`` (default: ``all_reduce``).
    """

    nvidia_smi: str | None = None
    nvlink_status: str | None = None
    fabric_manager: str | None = None
    fi_info: str | None = None
    all_reduce: str | None = None
    nccl_log: str | None = None


@dataclass(frozen=True)
class CheckResult:
    """One check of a node. ``passed``: True / False / None (not checked for this type);
    ``measured`` / ``expected``: JSON scalars; ``source``: the command, or the baseline's source."""

    name: str
    passed: bool | None
    measured: int | float | str | None
    expected: int | float | str | None
    detail: str
    source: str

    def to_dict(self) -> dict:
        """JSON form."""
        return {"name": self.name, "passed": self.passed, "measured": self.measured, "expected": self.expected,
                "detail": self.detail, "source": self.source}


@dataclass(frozen=True)
class NodeHealth:
    """The gate's result for one node (``health/<stack>/<node>.json``).

    Attributes:
        schema_version: :data:`SCHEMA_VERSION`.
        stack, node: the stack and the node's id (AWS instance id / GCE VM name).
        cloud, instance_type, nodes: what was expected of it.
        checked_at: ISO 8601 UTC time of the decision.
        checks: results in :data:`CHECKS` order.
        passed: no check failed.
    """

    stack: str
    node: str
    cloud: str
    instance_type: str
    nodes: int
    checked_at: str
    checks: tuple[CheckResult, ...]
    schema_version: str = SCHEMA_VERSION
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "passed", all(c.passed is not False for c in self.checks))

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        """Checks that failed."""
        return tuple(c for c in self.checks if c.passed is False)

    def check(self, name: str) -> CheckResult | None:
        """The check called ``name``, None when absent."""
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict:
        """JSON form, keys in a fixed order."""
        return {"schema_version": self.schema_version, "stack": self.stack, "node": self.node, "cloud": self.cloud,
                "instance_type": self.instance_type, "nodes": self.nodes, "checked_at": self.checked_at,
                "checks": [c.to_dict() for c in self.checks], "passed": self.passed}

    def to_json(self) -> str:
        """The document as uploaded."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: object) -> NodeHealth:
        """Read a document back.

        Raises:
            ValueError: not an object, another schema version, a missing or mistyped field, or
                a ``passed`` that does not follow from the checks.
        """
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema_version {data.get('schema_version')!r}, this gpuinfra reads {SCHEMA_VERSION!r}")
        try:
            checks = tuple(CheckResult(str(c["name"]), c["passed"], c["measured"], c["expected"], str(c["detail"]),
                                       str(c["source"])) for c in data["checks"])
            health = cls(str(data["stack"]), str(data["node"]), str(data["cloud"]), str(data["instance_type"]),
                         int(data["nodes"]), str(data["checked_at"]), checks)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"missing or invalid field: {exc!r}") from None
        if any(c.passed not in (True, False, None) for c in checks):
            raise ValueError("a check's passed is not true, false or null")
        if data.get("passed") is not health.passed:
            raise ValueError(f"passed is {data.get('passed')!r} but the checks say {health.passed}")
        return health


# --------------------------------------------------------------------------------- checks
def _result(name: str, passed: bool | None, measured, expected, detail: str, source: str) -> CheckResult:
    return CheckResult(name, passed, measured, expected, detail, source)


def _not_run(name: str, command: str, expected) -> CheckResult:
    return _result(name, False, None, expected, f"not run: no output of `{command}`", command)


def _gpu_count(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "gpu_count", p.NVIDIA_SMI_QUERY
    if out.nvidia_smi is None:
        return _not_run(name, cmd, exp.gpu_count)
    try:
        gpus = p.parse_nvidia_smi_query(out.nvidia_smi)
    except ValueError as exc:
        return _result(name, False, None, exp.gpu_count, f"unreadable output: {exc}", cmd)
    models = ", ".join(sorted({g.name for g in gpus})) or "none"
    detail = f"{len(gpus)} of {exp.gpu_count} GPUs visible ({models})"
    return _result(name, len(gpus) == exp.gpu_count, len(gpus), exp.gpu_count, detail, cmd)


def _ecc(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "ecc", p.NVIDIA_SMI_QUERY
    if out.nvidia_smi is None:
        return _not_run(name, cmd, 0)
    try:
        gpus = p.parse_nvidia_smi_query(out.nvidia_smi)
    except ValueError as exc:
        return _result(name, False, None, 0, f"unreadable output: {exc}", cmd)
    if not p.has_ecc_column(out.nvidia_smi):
        return _result(name, False, None, 0, "the query has no ecc.errors.uncorrected.volatile.total column", cmd)
    known = [g for g in gpus if g.ecc_uncorrected_volatile is not None]
    if not known:
        return _result(name, None, None, 0, "not checked (the driver reports no ECC counters: [N/A])", cmd)
    bad = [g for g in known if g.ecc_uncorrected_volatile]
    total = sum(g.ecc_uncorrected_volatile for g in known)
    detail = ("; ".join(f"GPU {g.index}: {g.ecc_uncorrected_volatile} uncorrectable volatile ECC errors" for g in bad)
              if bad else f"no uncorrectable volatile ECC error on {len(known)} GPUs")
    return _result(name, not bad, total, 0, detail, cmd)


def _nvlink(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "nvlink", p.NVLINK_STATUS_COMMAND
    if not exp.nvswitch:
        return _result(name, None, None, None, f"not checked ({exp.instance_type} has no NVSwitch)", cmd)
    if out.nvlink_status is None:
        return _not_run(name, cmd, 0)
    try:
        gpus = p.parse_nvlink_status(out.nvlink_status)
    except ValueError as exc:
        return _result(name, False, None, 0, f"unreadable output: {exc}", cmd)
    problems = [f"GPU {g.gpu}: no NVLink listed" for g in gpus if not g.links]
    problems += [f"GPU {g.gpu}: link{'s' if len(g.inactive) > 1 else ''} {', '.join(map(str, g.inactive))} inactive"
                 for g in gpus if g.inactive]
    inactive = sum(len(g.inactive) for g in gpus)
    links = sum(len(g.links) for g in gpus)
    detail = "; ".join(problems) if problems else f"{links} links active on {len(gpus)} GPUs"
    return _result(name, not problems, inactive, 0, detail, cmd)


def _fabric_manager(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "fabric_manager", p.FABRIC_MANAGER_COMMAND
    if not exp.nvswitch:
        return _result(name, None, None, None, f"not checked ({exp.instance_type} has no NVSwitch)", cmd)
    if out.fabric_manager is None:
        return _not_run(name, cmd, "active")
    try:
        state = p.parse_unit_state(out.fabric_manager)
    except ValueError as exc:
        return _result(name, False, None, "active", f"unreadable output: {exc}", cmd)
    return _result(name, state.active, state.state, "active", f"nvidia-fabricmanager is {state.state}", cmd)


def _efa(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "efa_devices", p.FI_INFO_COMMAND
    if exp.efa_count == 0:
        return _result(name, None, None, 0, f"not checked ({exp.instance_type} has no EFA)", cmd)
    if out.fi_info is None:
        return _not_run(name, cmd, exp.efa_count)
    try:
        efa = p.parse_fi_info(out.fi_info)
    except ValueError as exc:
        return _result(name, False, None, exp.efa_count, f"unreadable output: {exc}", cmd)
    found = efa.error or (", ".join(efa.devices) if efa.devices else "none")
    detail = f"{efa.count} of {exp.efa_count} EFA devices ({found})"
    return _result(name, efa.count == exp.efa_count, efa.count, exp.efa_count, detail, cmd)


def _gpudirect(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "gpudirect_plugin", ALL_REDUCE_COMMAND
    plugin = GPUDIRECT_PLUGINS.get(exp.nic_layout)
    if plugin is None:
        return _result(name, None, None, None, f"not checked ({exp.instance_type} uses {exp.nic_layout}: no GPUDirect "
                       "network plugin)", cmd)
    label, markers, networks = plugin
    if exp.nodes < 2:
        return _result(name, None, None, label, "not checked (one node: no traffic between nodes)", cmd)
    log = out.nccl_log if out.nccl_log is not None else out.all_reduce
    if log is None:
        return _not_run(name, cmd, label)
    try:
        net = p.parse_nccl_net(log)
    except ValueError as exc:
        return _result(name, False, None, label, str(exc), cmd)
    seen = [f"NET/{t}" for t in net.transports if t in markers]
    seen += [n for n in net.networks + net.loaded_plugins if n.startswith(networks)]
    measured = ", ".join(net.networks) or ", ".join(f"NET/{t}" for t in net.transports) or None
    others = [n for n in net.networks if not n.startswith(networks)]
    if seen and not others:
        return _result(name, True, measured, label, f"NCCL loaded {label} ({', '.join(dict.fromkeys(seen))})", cmd)
    why = (f"NCCL used network {', '.join(others)}" if others
           else "NCCL found no net plugin (libnccl-net.so)" if net.no_plugin
           else f"no {label} line in NCCL's INFO output")
    return _result(name, False, measured, label, f"{why}, not {label}", cmd)


def _all_reduce(out: GateOutputs) -> p.AllReduceResult | str:
    if out.all_reduce is None:
        return f"not run: no output of `{ALL_REDUCE_COMMAND}`"
    try:
        return p.parse_all_reduce(out.all_reduce)
    except ValueError as exc:
        return f"unreadable output: {exc}"


def _allreduce_correct(run: p.AllReduceResult | str) -> CheckResult:
    name, cmd = "allreduce_correct", ALL_REDUCE_COMMAND
    if isinstance(run, str):
        return _result(name, False, None, 0, run, cmd)
    oob = run.out_of_bounds or 0
    if not run.validated and not oob:
        return _result(name, None, None, 0, "not checked (the run did not validate results: #wrong N/A; use -c 1)", cmd)
    wrong = sum(r.wrong for r in run.wrong_rows)
    detail = ("; ".join(f"{r.wrong} wrong elements at {r.size_bytes} B" for r in run.wrong_rows)
              or f"no wrong element in {len(run.rows)} sizes")
    if oob:
        detail += f"; out of bounds values: {oob}"
    return _result(name, not wrong and not oob, wrong, 0, detail, cmd)


def _allreduce_busbw(exp: Expectations, run: p.AllReduceResult | str) -> CheckResult:
    name, cmd = "allreduce_busbw", ALL_REDUCE_COMMAND
    scope = "inter-node" if exp.nodes > 1 else "intra-node"
    base = exp.baseline
    if base is None:
        return _result(name, None, None, None, f"not checked (no baseline for {exp.instance_type} {scope})", cmd)
    if isinstance(run, str):
        return _result(name, False, None, base.busbw_gbps, run, base.source)
    row = run.largest if base.message_size_bytes is None else run.at_size(base.message_size_bytes)
    if row is None:
        return _result(name, False, None, base.busbw_gbps,
                       f"no {base.message_size_bytes} B row (largest: {run.largest.size_bytes} B); run all_reduce_perf "
                       f"up to at least {base.message_size_bytes} B", base.source)
    threshold = round(exp.busbw_pass_fraction * base.busbw_gbps, 2)
    measured = row.oop_busbw_gbps
    detail = (f"{measured:.2f} GB/s at {row.size_bytes} B, needs >= {exp.busbw_pass_fraction:g} x "
              f"{base.busbw_gbps:.2f} = {threshold:.2f} GB/s ({scope} baseline)")
    return _result(name, measured >= threshold, measured, base.busbw_gbps, detail, base.source)


def decide(expectations: Expectations, outputs: GateOutputs, *, stack: str, node: str,
           checked_at: datetime | None = None) -> NodeHealth:
    """Run every check on what the node collected.

    Args:
        expectations: what the type must show (:func:`gpuinfra.health.report.expectations_for`).
        outputs: the raw command outputs; a missing one fails the checks that need it.
        stack, node: written into the document.
        checked_at: decision time (default: now, UTC).

    Returns:
        The node's result; ``passed`` is False when any check failed. Unparseable output fails
        its check with the parser's reason (it never raises).
    """
    run = _all_reduce(outputs)
    checks = (_gpu_count(expectations, outputs), _ecc(expectations, outputs), _nvlink(expectations, outputs),
              _fabric_manager(expectations, outputs), _efa(expectations, outputs), _gpudirect(expectations, outputs),
              _allreduce_correct(run), _allreduce_busbw(expectations, run))
    when = (checked_at or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat(timespec="seconds")
    return NodeHealth(stack, node, expectations.cloud, expectations.instance_type, expectations.nodes, when, checks)
