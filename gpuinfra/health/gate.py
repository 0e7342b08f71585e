"""The boot health gate's decision and its result document.

Standard library only: a node runs this next to :mod:`gpuinfra.health.parsers` at boot, before
ranks are assigned. The node collects the raw outputs (:class:`GateOutputs`), the deploy step
gives it what the node must show as deployed (:class:`Expectations`, built from the stack's
spec and its cluster plan by :func:`gpuinfra.plan.health.expectations_for`), :func:`decide`
turns both into a :class:`NodeHealth`, which the node uploads as JSON to
``<bucket>/health/<stack>/<node>.json`` (:func:`health_key`) and ``gpuinfra check`` reads back.

Checks, in order (:data:`CHECKS`); each passes (``true``), fails (``false``) or is not checked
for this node (``null``, with the reason); a node passes when no check failed:

* ``gpu_count``: GPUs ``nvidia-smi`` lists == the spec's GPUs per node;
* ``ecc``: no uncorrectable volatile ECC error on any GPU;
* ``nvlink`` (types with NVSwitch): every GPU listed, no ``<inactive>`` NVLink, and each GPU
  has the NVLink count of the type where the expectations give one (the catalog facts do not
  yet: then the detail says links per GPU were not checked);
* ``fabric_manager`` (types with NVSwitch): ``nvidia-fabricmanager`` is active;
* ``efa_devices``: EFA devices ``fi_info -p efa`` lists == the EFA interfaces the cluster plan
  attached (0 with ``high_bandwidth_networking: off``: not checked);
* ``gpudirect_plugin`` (2+ nodes on a GPUDirect network): NCCL used the plugin's network. For
  EFA only ``NCCL INFO Using network AWS Libfabric`` / ``Using network Libfabric`` counts (the
  network NCCL selected; ``NET/OFI Initializing aws-ofi-nccl`` only shows the plugin started).
  Any other ``Using network`` name (``Socket``, ``IB``) fails it: some communicators fell back;
* ``allreduce_ranks``: the ``# Using devices`` list has nodes x GPUs per node ranks on as many
  hosts (a "2-node" run on one node, or on one GPU per node, is not the cluster's run);
* ``allreduce_complete``: the run finished (:func:`run_problems` has the rule);
* ``allreduce_correct``: ``all_reduce_perf`` found no wrong element and no out-of-bounds value;
* ``allreduce_busbw``: out-of-place busbw at the baseline's message size >=
  :data:`BUSBW_PASS_FRACTION` x the baseline measured on as many nodes of the type over the
  same network; no such baseline: not checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone

from gpuinfra.health import parsers as p
from gpuinfra.health.baselines import Baseline

#: "3": ``stage`` and ``address`` were added ("2" added allreduce_ranks and allreduce_complete);
#: an older document is not read (it would pass without them).
SCHEMA_VERSION = "3"
#: ``local``: the checks a node runs on itself before ranks are assigned (the all-reduce checks
#: are pending); ``cluster``: every check, after the cluster all-reduce over the healthy nodes.
STAGES = ("local", "cluster")
#: Checks that need the cluster all-reduce (pending in the ``local`` stage).
ALL_REDUCE_CHECKS = (
    "gpudirect_plugin",
    "allreduce_ranks",
    "allreduce_complete",
    "allreduce_correct",
    "allreduce_busbw",
)
HEALTH_PREFIX = "health"
#: Share of the baseline busbw a node must reach. The baselines come from other clusters and
#: software versions, so the margin is wider than nccl-tests' own ``--check_avg_bw`` (which
#: fails below 0.9 x the given value: NVIDIA/nccl-tests src/util.cu, the ``Avg bus bandwidth``
#: footer).
BUSBW_PASS_FRACTION = 0.8
CHECKS = (
    "gpu_count",
    "ecc",
    "nvlink",
    "fabric_manager",
    "efa_devices",
    "gpudirect_plugin",
    "allreduce_ranks",
    "allreduce_complete",
    "allreduce_correct",
    "allreduce_busbw",
)
ALL_REDUCE_COMMAND = (
    "all-reduce in the nccl-tests table layout (gpuinfra-allreduce or all_reduce_perf), NCCL_DEBUG=INFO"
)


@dataclass(frozen=True)
class GpudirectPlugin:
    """How NCCL shows it used a ``nic_layout``'s network plugin.

    Attributes:
        label: the plugin, for messages.
        networks: ``Using network <name>`` prefixes of the plugin.
        markers: ``NET/<transport>`` prefixes the plugin logs.
        network_line_required: only a ``Using network`` line counts (the markers show the
            plugin started, not that NCCL chose it); False where no public log with the plugin's
            ``Using network`` line was found, so its markers count too.
    """

    label: str
    networks: tuple[str, ...]
    markers: tuple[str, ...]
    network_line_required: bool


#: ``nic_layout`` -> plugin. EFA: NCCL logs ``Using network AWS Libfabric`` when it selected
#: aws-ofi-nccl (aws-samples/aws-efa-eks README.md L157, 2 x p4d; aws-ia/terraform-aws-eks-blueprints
#: examples/eks-efa/README.md, 2 x g4dn.metal; newer plugins name it ``Libfabric``), while
#: ``NET/OFI`` lines are the plugin's own start-up. TCPX logs ``NET/GPUDirectTCPX`` (skypilot
#: examples/gcp_gpu_direct_tcpx/README.md); TCPXO's plugin is FasTrak (container-engine-accelerators
#: gpudirect-tcpxo/README.md); gIB is selected with ``NCCL_NET=gIB`` (cluster-toolkit
#: examples/gke-a3-ultragpu/nccl-jobset-example.yaml) and NCCL logs ``Using network <NCCL_NET>``.
GPUDIRECT_PLUGINS: dict[str, GpudirectPlugin] = {
    "efa": GpudirectPlugin("aws-ofi-nccl (AWS Libfabric)", ("AWS Libfabric", "Libfabric"), ("OFI",), True),
    "tcpx": GpudirectPlugin("GPUDirect-TCPX", ("GPUDirectTCPX",), ("GPUDirectTCPX",), False),
    "tcpxo": GpudirectPlugin("GPUDirect-TCPXO (FasTrak)", ("FasTrak",), ("FasTrak",), False),
    "gib": GpudirectPlugin("NCCL/gIB", ("gIB",), ("gIB",), False),
}


def health_key(stack: str, node: str) -> str:
    """Object key of a node's result: ``health/<stack>/<node>.json``."""
    return f"{HEALTH_PREFIX}/{stack}/{node}.json"


@dataclass(frozen=True)
class Expectations:
    """What a node of the cluster must show, as deployed (built by
    :func:`gpuinfra.plan.health.expectations_for` from the spec, its cluster plan and the
    baseline table).

    Attributes:
        cloud, instance_type: the type.
        nodes: nodes in the cluster (2+: the all-reduce crosses the network).
        gpu_count: GPUs per node (the spec's: GCP N1 hosts have attached GPUs).
        efa_count: EFA devices the cluster plan attached per node (0: none, e.g. with
            ``high_bandwidth_networking: off``).
        nvswitch: GPUs on NVSwitch (NVLink and fabric manager are checked).
        nic_layout: the deployed network: ``efa`` | ``ena`` | ``gvnic`` | ``tcpx`` | ``tcpxo`` |
            ``gib`` (``ena`` / ``gvnic`` when the plan attached no GPUDirect NICs).
        baseline: the busbw baseline for this node count and network, None when the table has none.
        busbw_pass_fraction: share of the baseline a node must reach.
        nvlinks_per_gpu: NVLinks each GPU must list; None when not known (the catalog facts do
            not give it), then the count per GPU is not checked.
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
    nvlinks_per_gpu: int | None = None

    @property
    def ranks(self) -> int:
        """Ranks of the cluster's all-reduce: one per GPU."""
        return self.nodes * self.gpu_count

    def to_dict(self) -> dict:
        """JSON form (the deploy step writes it for the node)."""
        return {
            "cloud": self.cloud,
            "instance_type": self.instance_type,
            "nodes": self.nodes,
            "gpu_count": self.gpu_count,
            "efa_count": self.efa_count,
            "nvswitch": self.nvswitch,
            "nic_layout": self.nic_layout,
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "busbw_pass_fraction": self.busbw_pass_fraction,
            "nvlinks_per_gpu": self.nvlinks_per_gpu,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Expectations:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        try:
            links = data.get("nvlinks_per_gpu")
            return cls(
                str(data["cloud"]),
                str(data["instance_type"]),
                int(data["nodes"]),
                int(data["gpu_count"]),
                int(data["efa_count"]),
                bool(data["nvswitch"]),
                str(data["nic_layout"]),
                Baseline.from_dict(data["baseline"]) if data.get("baseline") else None,
                float(data.get("busbw_pass_fraction", BUSBW_PASS_FRACTION)),
                None if links is None else int(links),
            )
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
        return {
            "name": self.name,
            "passed": self.passed,
            "measured": self.measured,
            "expected": self.expected,
            "detail": self.detail,
            "source": self.source,
        }


@dataclass(frozen=True)
class NodeHealth:
    """The gate's result for one node (``health/<stack>/<node>.json``).

    Attributes:
        schema_version: :data:`SCHEMA_VERSION`.
        stack, node: the stack and the node's id (AWS instance id / GCE VM name).
        cloud, instance_type, nodes: what was expected of it.
        checked_at: ISO 8601 UTC time of the decision.
        checks: results in :data:`CHECKS` order.
        stage: ``local`` | ``cluster`` (:data:`STAGES`).
        address: the node's private IP address (peers match results to the addresses they
            rank by), "" when unknown.
        deployment: the deployment id of the node (``GPUINFRA_DEPLOYMENT``), "" when it has none;
            peers count only results of their own deployment.
        passed: no check failed.
    """

    stack: str
    node: str
    cloud: str
    instance_type: str
    nodes: int
    checked_at: str
    checks: tuple[CheckResult, ...]
    stage: str = "cluster"
    address: str = ""
    deployment: str = ""
    schema_version: str = SCHEMA_VERSION
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "passed", all(c.passed is not False for c in self.checks))

    @property
    def verdict(self) -> str:
        """``FAIL`` (a check failed), ``PENDING`` (local checks passed, no cluster all-reduce
        yet) or ``PASS``."""
        if not self.passed:
            return "FAIL"
        return "PENDING" if self.stage == "local" else "PASS"

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        """Checks that failed."""
        return tuple(c for c in self.checks if c.passed is False)

    def check(self, name: str) -> CheckResult | None:
        """The check called ``name``, None when absent."""
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict:
        """JSON form, keys in a fixed order."""
        return {
            "schema_version": self.schema_version,
            "stack": self.stack,
            "node": self.node,
            "cloud": self.cloud,
            "instance_type": self.instance_type,
            "nodes": self.nodes,
            "checked_at": self.checked_at,
            "stage": self.stage,
            "address": self.address,
            "deployment": self.deployment,
            "checks": [c.to_dict() for c in self.checks],
            "passed": self.passed,
        }

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
            checks = tuple(
                CheckResult(
                    str(c["name"]), c["passed"], c["measured"], c["expected"], str(c["detail"]), str(c["source"])
                )
                for c in data["checks"]
            )
            health = cls(
                str(data["stack"]),
                str(data["node"]),
                str(data["cloud"]),
                str(data["instance_type"]),
                int(data["nodes"]),
                str(data["checked_at"]),
                checks,
                str(data["stage"]),
                str(data["address"]),
                str(data.get("deployment") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"missing or invalid field: {exc!r}") from None
        if health.stage not in STAGES:
            raise ValueError(f"stage {health.stage!r} is not one of {', '.join(STAGES)}")
        if any(c.passed not in (True, False, None) for c in checks):
            raise ValueError("a check's passed is not true, false or null")
        if tuple(c.name for c in checks) != CHECKS:
            raise ValueError(f"checks are {', '.join(c.name for c in checks) or 'none'}, not {', '.join(CHECKS)}")
        if data.get("passed") is not health.passed:
            raise ValueError(f"passed is {data.get('passed')!r} but the checks say {health.passed}")
        return health


# --------------------------------------------------------------------------------- checks
def _result(name: str, passed: bool | None, measured, expected, detail: str, source: str) -> CheckResult:
    return CheckResult(name, passed, measured, expected, detail, source)


def _not_run(name: str, command: str, expected) -> CheckResult:
    return _result(name, False, None, expected, f"not run: no output of `{command}`", command)


def _read(name: str, command: str, text: str | None, parse, expected, *, skip: str | None = None):
    """The prelude every command check shares: ``(parsed, None)``, or ``(None, result)`` when the
    check is not checked (``skip`` is the reason), the command was not run, or its output is
    unreadable (the parser's reason)."""
    if skip:
        return None, _result(name, None, None, None, f"not checked ({skip})", command)
    if text is None:
        return None, _not_run(name, command, expected)
    try:
        return parse(text), None
    except ValueError as exc:
        return None, _result(name, False, None, expected, f"unreadable output: {exc}", command)


def _no_nvswitch(exp: Expectations) -> str | None:
    return None if exp.nvswitch else f"{exp.instance_type} has no NVSwitch"


def _gpu_count(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "gpu_count", p.NVIDIA_SMI_QUERY
    gpus, done = _read(name, cmd, out.nvidia_smi, p.parse_nvidia_smi_query, exp.gpu_count)
    if done:
        return done
    models = ", ".join(sorted({g.name for g in gpus})) or "none"
    detail = f"{len(gpus)} of {exp.gpu_count} GPUs visible ({models})"
    return _result(name, len(gpus) == exp.gpu_count, len(gpus), exp.gpu_count, detail, cmd)


def _ecc(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "ecc", p.NVIDIA_SMI_QUERY
    gpus, done = _read(name, cmd, out.nvidia_smi, p.parse_nvidia_smi_query, 0)
    if done:
        return done
    if not p.has_ecc_column(out.nvidia_smi or ""):  # not None: _read returned the not-run result
        return _result(name, False, None, 0, "the query has no ecc.errors.uncorrected.volatile.total column", cmd)
    known = [g for g in gpus if g.ecc_uncorrected_volatile is not None]
    if not known:
        return _result(name, None, None, 0, "not checked (the driver reports no ECC counters: [N/A])", cmd)
    bad = [g for g in known if g.ecc_uncorrected_volatile]
    total = sum(g.ecc_uncorrected_volatile for g in known)
    detail = (
        "; ".join(f"GPU {g.index}: {g.ecc_uncorrected_volatile} uncorrectable volatile ECC errors" for g in bad)
        if bad
        else f"no uncorrectable volatile ECC error on {len(known)} GPUs"
    )
    return _result(name, not bad, total, 0, detail, cmd)


def _nvlink(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "nvlink", p.NVLINK_STATUS_COMMAND
    gpus, done = _read(name, cmd, out.nvlink_status, p.parse_nvlink_status, 0, skip=_no_nvswitch(exp))
    if done:
        return done
    problems = [f"{len(gpus)} of {exp.gpu_count} GPUs listed"] if len(gpus) != exp.gpu_count else []
    problems += [f"GPU {g.gpu}: no NVLink listed" for g in gpus if not g.links]
    problems += [
        f"GPU {g.gpu}: link{'s' if len(g.inactive) > 1 else ''} {', '.join(map(str, g.inactive))} inactive"
        for g in gpus
        if g.inactive
    ]
    per_gpu = exp.nvlinks_per_gpu
    if per_gpu is not None:
        problems += [
            f"GPU {g.gpu}: {len(g.links)} of {per_gpu} NVLinks listed"
            for g in gpus
            if g.links and len(g.links) != per_gpu
        ]
    inactive = sum(len(g.inactive) for g in gpus)
    links = sum(len(g.links) for g in gpus)
    counted = (
        f"{per_gpu} per GPU"
        if per_gpu is not None
        else "links per GPU not checked (the catalog facts give no NVLink count per GPU)"
    )
    detail = "; ".join(problems) if problems else f"{links} links active on {len(gpus)} GPUs; {counted}"
    return _result(name, not problems, inactive, 0, detail, cmd)


def _fabric_manager(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "fabric_manager", p.FABRIC_MANAGER_COMMAND
    state, done = _read(name, cmd, out.fabric_manager, p.parse_unit_state, "active", skip=_no_nvswitch(exp))
    if done:
        return done
    return _result(name, state.active, state.state, "active", f"nvidia-fabricmanager is {state.state}", cmd)


def _efa(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "efa_devices", p.FI_INFO_COMMAND
    skip = None if exp.efa_count else f"the cluster plan attaches no EFA to {exp.instance_type}"
    efa, done = _read(name, cmd, out.fi_info, p.parse_fi_info, exp.efa_count, skip=skip)
    if done:
        return done
    found = efa.error or (", ".join(efa.devices) if efa.devices else "none")
    detail = f"{efa.count} of {exp.efa_count} EFA devices ({found})"
    return _result(name, efa.count == exp.efa_count, efa.count, exp.efa_count, detail, cmd)


def _gpudirect(exp: Expectations, out: GateOutputs) -> CheckResult:
    name, cmd = "gpudirect_plugin", ALL_REDUCE_COMMAND
    plugin = GPUDIRECT_PLUGINS.get(exp.nic_layout)
    if plugin is None:
        return _result(
            name,
            None,
            None,
            None,
            f"not checked ({exp.instance_type} uses {exp.nic_layout}: no GPUDirect network plugin)",
            cmd,
        )
    if exp.nodes < 2:
        return _result(name, None, None, plugin.label, "not checked (one node: no traffic between nodes)", cmd)
    log = out.nccl_log if out.nccl_log is not None else out.all_reduce
    if log is None:
        return _not_run(name, cmd, plugin.label)
    try:
        net = p.parse_nccl_net(log)
    except ValueError as exc:
        return _result(name, False, None, plugin.label, str(exc), cmd)
    ours = [n for n in net.networks if n.startswith(plugin.networks)]
    others = [n for n in net.networks if not n.startswith(plugin.networks)]
    started = [f"NET/{t}" for t in net.transports if t in plugin.markers]
    if not plugin.network_line_required:
        started += [n for n in net.loaded_plugins if n.startswith(plugin.networks)]
    measured = ", ".join(net.networks) or ", ".join(f"NET/{t}" for t in net.transports) or None
    if not others and (ours or (started and not plugin.network_line_required)):
        shown = f"network {', '.join(ours)}" if ours else ", ".join(dict.fromkeys(started))
        return _result(name, True, measured, plugin.label, f"NCCL used {plugin.label} ({shown})", cmd)
    if others:
        why = f"NCCL used network {', '.join(others)}"
    elif net.no_plugin:
        why = "NCCL found no net plugin (libnccl-net.so)"
    elif started:
        why = (
            f"the plugin started ({', '.join(dict.fromkeys(started))}) but no `Using network "
            f"{plugin.networks[0]}` line shows NCCL used it"
        )
    else:
        why = f"no {plugin.label} line in NCCL's INFO output"
    return _result(name, False, measured, plugin.label, f"{why}, not {plugin.label}", cmd)


def _all_reduce(out: GateOutputs) -> p.AllReduceResult | str:
    if out.all_reduce is None:
        return f"not run: no output of `{ALL_REDUCE_COMMAND}`"
    try:
        return p.parse_all_reduce(out.all_reduce)
    except ValueError as exc:
        return f"unreadable output: {exc}"


def _allreduce_ranks(exp: Expectations, run: p.AllReduceResult | str) -> CheckResult:
    name, cmd = "allreduce_ranks", ALL_REDUCE_COMMAND
    want = f"{exp.nodes} node{'s' if exp.nodes > 1 else ''} x {exp.gpu_count} GPUs = {exp.ranks} ranks"
    if isinstance(run, str):
        return _result(name, False, None, exp.ranks, run, cmd)
    if run.ranks is None:
        return _result(
            name,
            False,
            None,
            exp.ranks,
            "no `# Rank` lines (the `# Using devices` list all_reduce_perf "
            f"prints before the table): cannot tell whether the run spanned the cluster; needs {want}",
            cmd,
        )
    problems = [f"{run.ranks} ranks"] if run.ranks != exp.ranks else []
    if run.hosts and len(run.hosts) != exp.nodes:
        problems.append(f"on {len(run.hosts)} host{'s' if len(run.hosts) > 1 else ''} ({', '.join(run.hosts)})")
    on = f" on {len(run.hosts)} hosts" if run.hosts else ""
    detail = f"{', '.join(problems)}, needs {want}" if problems else f"{run.ranks} ranks{on} ({want})"
    return _result(name, not problems, run.ranks, exp.ranks, detail, cmd)


def run_problems(run: p.AllReduceResult) -> list[str]:
    """Why an ``all_reduce_perf`` run did not finish; empty when it did.

    The rule: (1) both footer lines, ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus
    bandwidth : X``, are there (nccl-tests prints them once, after the last size: a crash, hang
    or kill leaves them out); (2) where the output has the ``# nThread ... maxBytes M step:
    S(factor|bytes)`` line, the table reached the last size of that plan (its next step would pass
    M); (3) no ``NCCL WARN`` line, from any rank (NCCL warns where it returns an error; a warning
    that turns out harmless still fails the gate: it fails closed). A table cut before the size
    the baseline is read at also fails ``allreduce_busbw`` ("no ... B row").
    """
    problems = []
    if not run.has_footer:
        problems.append("no `# Out of bounds values` / `# Avg bus bandwidth` footer: all_reduce_perf did not finish")
    if run.sizes_done is False:
        problems.append(f"the table stops at {run.largest.size_bytes} B; the run was set up to go to {run.max_bytes} B")
    if run.warnings:
        more = f" (and {len(run.warnings) - 1} more)" if len(run.warnings) > 1 else ""
        problems.append(f"NCCL warned: {run.warnings[0][:200]}{more}")
    return problems


def _allreduce_complete(run: p.AllReduceResult | str) -> CheckResult:
    name, cmd = "allreduce_complete", ALL_REDUCE_COMMAND
    if isinstance(run, str):
        return _result(name, False, None, None, run, cmd)
    problems = run_problems(run)
    last, planned = run.largest.size_bytes, run.max_bytes
    detail = "; ".join(problems) or (f"finished: {len(run.rows)} sizes up to {last} B, footer present, no NCCL WARN")
    return _result(name, not problems, last, planned, detail, cmd)


def _allreduce_correct(run: p.AllReduceResult | str) -> CheckResult:
    name, cmd = "allreduce_correct", ALL_REDUCE_COMMAND
    if isinstance(run, str):
        return _result(name, False, None, 0, run, cmd)
    oob = run.out_of_bounds or 0
    if not run.validated and not oob:
        return _result(name, None, None, 0, "not checked (the run did not validate results: #wrong N/A; use -c 1)", cmd)
    wrong = sum(r.wrong for r in run.wrong_rows)
    detail = (
        "; ".join(f"{r.wrong} wrong elements at {r.size_bytes} B" for r in run.wrong_rows)
        or f"no wrong element in {len(run.rows)} sizes"
    )
    if oob:
        detail += f"; out of bounds values: {oob}"
    return _result(name, not wrong and not oob, wrong, 0, detail, cmd)


def _allreduce_busbw(exp: Expectations, run: p.AllReduceResult | str, ranks: CheckResult) -> CheckResult:
    name, cmd = "allreduce_busbw", ALL_REDUCE_COMMAND
    base = exp.baseline
    if base is None:
        nodes = f"{exp.nodes} node{'s' if exp.nodes > 1 else ''}"
        over = f" over {exp.nic_layout}" if exp.nodes > 1 else ""
        return _result(
            name, None, None, None, f"not checked (no baseline for {exp.instance_type} on {nodes}{over})", cmd
        )
    if isinstance(run, str):
        return _result(name, False, None, base.busbw_gbps, run, base.source)
    if ranks.passed is False:
        return _result(
            name,
            False,
            None,
            base.busbw_gbps,
            f"not compared until allreduce_ranks passes ({ranks.detail})",
            base.source,
        )
    row = run.at_size(base.message_size_bytes)
    if row is None:
        return _result(
            name,
            False,
            None,
            base.busbw_gbps,
            f"no {base.message_size_bytes} B row (largest: {run.largest.size_bytes} B); run all_reduce_perf "
            f"up to at least {base.message_size_bytes} B",
            base.source,
        )
    threshold = round(exp.busbw_pass_fraction * base.busbw_gbps, 2)
    measured = row.oop_busbw_gbps
    detail = (
        f"{measured:.2f} GB/s at {row.size_bytes} B, needs >= {exp.busbw_pass_fraction:g} x "
        f"{base.busbw_gbps:.2f} = {threshold:.2f} GB/s ({base.nodes}-node baseline)"
    )
    return _result(name, measured >= threshold, measured, base.busbw_gbps, detail, base.source)


def _pending(check: CheckResult) -> CheckResult:
    return _result(
        check.name,
        None,
        None,
        check.expected,
        "pending: the cluster all-reduce runs once every node has passed its local checks",
        check.source,
    )


def decide(
    expectations: Expectations,
    outputs: GateOutputs,
    *,
    stack: str,
    node: str,
    checked_at: datetime | None = None,
    stage: str = "cluster",
    address: str = "",
    deployment: str = "",
) -> NodeHealth:
    """Run every check on what the node collected.

    Args:
        expectations: what the node must show (:func:`gpuinfra.plan.health.expectations_for`).
        outputs: the raw command outputs; a missing one fails the checks that need it.
        stack, node: written into the document.
        checked_at: decision time (default: now, UTC).
        stage: ``local`` -> the :data:`ALL_REDUCE_CHECKS` are pending (not checked), whatever
            ``outputs`` holds; ``cluster`` -> every check.
        address: the node's private IP, written into the document.
        deployment: the node's deployment id, written into the document.

    Raises:
        ValueError: ``stage`` is not one of :data:`STAGES`.

    Returns:
        The node's result; ``passed`` is False when any check failed. Unparseable output fails
        its check with the parser's reason (it never raises).
    """
    run = _all_reduce(outputs)
    ranks = _allreduce_ranks(expectations, run)
    checks: tuple[CheckResult, ...] = (
        _gpu_count(expectations, outputs),
        _ecc(expectations, outputs),
        _nvlink(expectations, outputs),
        _fabric_manager(expectations, outputs),
        _efa(expectations, outputs),
        _gpudirect(expectations, outputs),
        ranks,
        _allreduce_complete(run),
        _allreduce_correct(run),
        _allreduce_busbw(expectations, run, ranks),
    )
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r} is not one of {', '.join(STAGES)}")
    if stage == "local":
        checks = tuple(_pending(c) if c.name in ALL_REDUCE_CHECKS else c for c in checks)
    when = (checked_at or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat(timespec="seconds")
    return NodeHealth(
        stack,
        node,
        expectations.cloud,
        expectations.instance_type,
        expectations.nodes,
        when,
        checks,
        stage,
        address,
        deployment,
    )
