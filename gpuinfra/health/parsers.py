"""Parsers for the outputs the boot health gate collects on a node.

Standard library only: this module runs on the nodes (next to :mod:`gpuinfra.health.gate`),
where gpuinfra's dependencies are not installed. Each parser takes the command's text output,
returns frozen dataclasses and raises :class:`ValueError` with a one-line reason when the text is
not what the command prints. Formats, with where they are defined:

* ``nvidia-smi --query-gpu=... --format=csv`` (:data:`NVIDIA_SMI_QUERY`): a header row of field
  names (units in brackets unless ``nounits``), then one row per GPU; ``[N/A]`` / ``[Not
  Supported]`` where a counter is unavailable. Field meanings: ``nvidia-smi --help-query-gpu``
  and https://docs.nvidia.com/deploy/nvidia-smi ("Volatile error counters track the number of
  errors detected since the last driver load"). ``No devices were found`` means zero GPUs.
* ``nvidia-smi nvlink -s``: ``GPU <i>: <name> (UUID: ...)`` then ``Link <n>: <x> GB/s`` or
  ``Link <n>: <inactive>`` per link (recorded outputs: tests/fixtures/health/).
* ``fi_info -p efa``: blocks of ``provider:`` / ``fabric:`` / ``domain:`` ... lines; one EFA
  device appears under several domains (``<dev>-rdm``, ``<dev>-dgrm``) and fabrics (``efa``,
  ``efa-direct``), so devices are the distinct domain names without that suffix.
  ``fi_getinfo: -61`` (-FI_ENODATA) means no EFA device (libfabric fi_getinfo(3)).
* ``all_reduce_perf`` (NVIDIA/nccl-tests ``src/util.cu`` ``writeResultHeader`` /
  ``writeBenchmarkLineBody`` / footer): ``# nThread T nGpus G minBytes B maxBytes M step:
  S(factor|bytes) ...``, the ``# Using devices`` list (``#  Rank  r Group  g Pid p on <host>
  device d [bus] <model>``, one line per rank), the ``# size count type redop root time algbw
  busbw #wrong time algbw busbw #wrong`` table (out-of-place then in-place; ``#wrong`` is ``N/A``
  when not validated), then, once the last size is done, ``# Out of bounds values : N
  OK|FAILED`` and ``# Avg bus bandwidth : X``.
  Lines may carry a launcher prefix (``0: `` from srun, ``[1,0]<stdout>:`` from mpirun
  ``--tag-output``); the prefix is taken from the header line.
* NCCL ``NCCL_DEBUG=INFO`` lines: ``NCCL INFO Using network <name>`` (NCCL core),
  ``NET/Plugin: Loaded net plugin <name>``, ``NET/<transport> ...`` (aws-ofi-nccl logs
  ``NET/OFI``, GPUDirect-TCPX ``NET/GPUDirectTCPX``, TCPXO ``NET/FasTrak``, NCCL/gIB ``NET/gIB``).
* ``systemctl is-active nvidia-fabricmanager``: one state word (systemctl(1) ``is-active``).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

#: The query the node runs for :func:`parse_nvidia_smi_query` (fields: ``nvidia-smi
#: --help-query-gpu``). ``ecc.errors.uncorrected.volatile.total``: uncorrectable ECC errors since
#: the driver loaded, summed over the whole chip.
NVIDIA_SMI_QUERY = (
    "nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,ecc.mode.current,"
    "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total --format=csv"
)
NVLINK_STATUS_COMMAND = "nvidia-smi nvlink -s"
FI_INFO_COMMAND = "fi_info -p efa"
FABRIC_MANAGER_COMMAND = "systemctl is-active nvidia-fabricmanager"

_UNAVAILABLE = {"n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", ""}


# ---------------------------------------------------------------------------- nvidia-smi query
@dataclass(frozen=True)
class GpuRow:
    """One GPU of ``nvidia-smi --query-gpu``.

    Attributes:
        index: nvidia-smi's GPU index.
        name: product name (``NVIDIA H100 80GB HBM3``).
        uuid: ``GPU-...`` when queried, else None.
        ecc_uncorrected_volatile: ``ecc.errors.uncorrected.volatile.total``; None when not
            queried or reported ``[N/A]`` (ECC disabled or unsupported).
        ecc_corrected_volatile: ``ecc.errors.corrected.volatile.total``, likewise.
    """

    index: int
    name: str
    uuid: str | None
    ecc_uncorrected_volatile: int | None
    ecc_corrected_volatile: int | None


def _field_name(header: str) -> str:
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", header.strip())


def _int_or_none(value: str | None, what: str) -> int | None:
    if value is None or value.strip().lower() in _UNAVAILABLE:
        return None
    text = value.strip().split()[0]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"nvidia-smi: {what} is {value.strip()!r}, not a number") from None


def _index(value: str) -> int:
    index = _int_or_none(value, "index")
    if index is None:
        raise ValueError(f"nvidia-smi: GPU index is {value.strip()!r}")
    return index


def parse_nvidia_smi_query(text: str) -> tuple[GpuRow, ...]:
    """GPUs from ``nvidia-smi --query-gpu=...,index,name,... --format=csv``.

    Returns:
        One row per GPU in output order; empty for ``No devices were found``.

    Raises:
        ValueError: nvidia-smi printed an error, no CSV header with ``index`` and ``name``, or a
            row of the wrong width.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("nvidia-smi printed nothing")
    if lines[0].strip().startswith("No devices were found"):
        return ()
    rows = list(csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True))
    header = [_field_name(h) for h in rows[0]]
    if "index" not in header or "name" not in header:
        raise ValueError(f"nvidia-smi output has no CSV header with index and name: {lines[0].strip()[:120]!r}")
    gpus = []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ValueError(f"nvidia-smi CSV line {number} has {len(row)} fields, the header {len(header)}")
        field = dict(zip(header, row, strict=True))
        gpus.append(
            GpuRow(
                index=_index(field["index"]),
                name=field["name"].strip(),
                uuid=(field.get("uuid") or "").strip() or None,
                ecc_uncorrected_volatile=_int_or_none(
                    field.get("ecc.errors.uncorrected.volatile.total"), "ecc.errors.uncorrected.volatile.total"
                ),
                ecc_corrected_volatile=_int_or_none(
                    field.get("ecc.errors.corrected.volatile.total"), "ecc.errors.corrected.volatile.total"
                ),
            )
        )
    return tuple(gpus)


def has_ecc_column(text: str) -> bool:
    """True when the query asked for ``ecc.errors.uncorrected.volatile.total``."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    return "ecc.errors.uncorrected.volatile.total" in first


# ------------------------------------------------------------------------------ nvlink status
@dataclass(frozen=True)
class NvLink:
    """One NVLink of one GPU: ``gbps`` is None when the link is ``<inactive>``."""

    link: int
    gbps: float | None

    @property
    def active(self) -> bool:
        """The link is up (a speed is reported)."""
        return self.gbps is not None


@dataclass(frozen=True)
class GpuNvLinks:
    """The links ``nvidia-smi nvlink -s`` lists for one GPU."""

    gpu: int
    name: str
    links: tuple[NvLink, ...]

    @property
    def inactive(self) -> tuple[int, ...]:
        """Link numbers reported ``<inactive>``."""
        return tuple(link.link for link in self.links if not link.active)


_GPU_LINE = re.compile(r"^\s*GPU\s+(\d+):\s*(.*?)\s*(?:\(UUID:[^)]*\))?\s*$")
_LINK_LINE = re.compile(r"^\s*Link\s+(\d+):\s*(?:(\d+(?:\.\d+)?)\s*GB/s|<inactive>)\s*$", re.IGNORECASE)


def parse_nvlink_status(text: str) -> tuple[GpuNvLinks, ...]:
    """Per-GPU link states from ``nvidia-smi nvlink -s``.

    Raises:
        ValueError: no ``GPU <i>:`` line, a ``Link`` line before any GPU, or a line that is
            neither (other nvlink subcommands print ``Link <n>: Data Tx: ...`` and are refused).
    """
    gpus: list[GpuNvLinks] = []
    links: list[NvLink] = []
    for line in text.splitlines():
        if not line.strip() or set(line.strip()) <= {"."}:
            continue  # blank, or an elision ("....") in a pasted excerpt
        gpu = _GPU_LINE.match(line)
        if gpu:
            if gpus:
                gpus[-1] = GpuNvLinks(gpus[-1].gpu, gpus[-1].name, tuple(links))
            gpus.append(GpuNvLinks(int(gpu.group(1)), gpu.group(2), ()))
            links = []
            continue
        link = _LINK_LINE.match(line)
        if link is None:
            raise ValueError(f"not `nvidia-smi nvlink -s` output: {line.strip()[:120]!r}")
        if not gpus:
            raise ValueError("`nvidia-smi nvlink -s` output has a Link line before any GPU line")
        links.append(NvLink(int(link.group(1)), float(link.group(2)) if link.group(2) else None))
    if not gpus:
        raise ValueError("`nvidia-smi nvlink -s` output lists no GPU")
    gpus[-1] = GpuNvLinks(gpus[-1].gpu, gpus[-1].name, tuple(links))
    return tuple(gpus)


# ----------------------------------------------------------------------------------- fi_info
@dataclass(frozen=True)
class EfaDevices:
    """What ``fi_info -p efa`` reports.

    Attributes:
        devices: distinct EFA devices (domain names without ``-rdm`` / ``-dgrm``), sorted.
        entries: provider blocks listed (a device appears in several).
        error: ``fi_getinfo: <code>`` when libfabric found nothing, else None.
    """

    devices: tuple[str, ...]
    entries: int
    error: str | None = None

    @property
    def count(self) -> int:
        """Number of EFA devices."""
        return len(self.devices)


_DOMAIN_SUFFIX = re.compile(r"-(rdm|dgrm|dgram)$")


def parse_fi_info(text: str) -> EfaDevices:
    """EFA devices from ``fi_info -p efa`` (optionally ``-t FI_EP_RDM``).

    Raises:
        ValueError: neither provider blocks nor a ``fi_getinfo:`` error line.
    """
    devices: set[str] = set()
    entries = 0
    provider = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("fi_getinfo:"):
            return EfaDevices((), 0, line)
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "provider":
            entries += 1
            provider = value
        elif key == "domain" and provider is not None and "efa" in provider.split(";")[0]:
            devices.add(_DOMAIN_SUFFIX.sub("", value))
    if not entries:
        raise ValueError(f"not `fi_info -p efa` output: {text.strip()[:120]!r}")
    return EfaDevices(tuple(sorted(devices)), entries)


# --------------------------------------------------------------------------- all_reduce_perf
@dataclass(frozen=True)
class AllReduceRow:
    """One message size of ``all_reduce_perf``: out-of-place (``oop_``) and in-place (``ip_``)
    time (us), algorithm and bus bandwidth (GB/s) and wrong elements (None for ``N/A``)."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    oop_time_us: float
    oop_algbw_gbps: float
    oop_busbw_gbps: float
    oop_wrong: int | None
    ip_time_us: float | None
    ip_algbw_gbps: float | None
    ip_busbw_gbps: float | None
    ip_wrong: int | None

    @property
    def wrong(self) -> int:
        """Wrong elements, out-of-place plus in-place (``N/A`` counts as 0)."""
        return (self.oop_wrong or 0) + (self.ip_wrong or 0)


@dataclass(frozen=True)
class AllReduceResult:
    """A parsed ``all_reduce_perf`` run.

    Attributes:
        rows: the table rows in output order.
        out_of_bounds: the ``# Out of bounds values`` count, None when the footer is missing.
        avg_busbw_gbps: ``# Avg bus bandwidth``, None when missing.
        ranks: distinct ranks of the ``# Using devices`` list (``#  Rank  3 Group  0 Pid ... on
            <host> device ...``), None when the list is not in the output.
        hosts: distinct host names of that list, in order.
        max_bytes, step, step_kind: from the ``# nThread 1 nGpus 1 minBytes B maxBytes M step:
            S(factor|bytes)`` line (None when not in the output): the sizes the run was set up
            to go through.
        warnings: every ``NCCL WARN`` line of the output (any rank, any prefix), stripped.
        validated: ``#wrong`` was reported (``-c 1``) for at least one row.
    """

    rows: tuple[AllReduceRow, ...]
    out_of_bounds: int | None
    avg_busbw_gbps: float | None
    ranks: int | None
    hosts: tuple[str, ...] = ()
    max_bytes: int | None = None
    step: int | None = None
    step_kind: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def validated(self) -> bool:
        """At least one row reports ``#wrong`` (the run checked its results)."""
        return any(r.oop_wrong is not None or r.ip_wrong is not None for r in self.rows)

    @property
    def wrong_rows(self) -> tuple[AllReduceRow, ...]:
        """Rows with wrong elements."""
        return tuple(r for r in self.rows if r.wrong > 0)

    @property
    def largest(self) -> AllReduceRow:
        """The row with the largest message (the last one at that size)."""
        return max(reversed(self.rows), key=lambda r: r.size_bytes)

    @property
    def has_footer(self) -> bool:
        """Both footer lines are there: nccl-tests prints them only after the last size."""
        return self.out_of_bounds is not None and self.avg_busbw_gbps is not None

    @property
    def sizes_done(self) -> bool | None:
        """The table reached the end of the planned sizes: the step after the largest row would
        pass ``maxBytes`` (nccl-tests' size loop, src/common.cu). None when the output has no
        ``# nThread ... maxBytes`` line to compare with."""
        if self.max_bytes is None or self.step is None:
            return None
        last = self.largest.size_bytes
        following = last * self.step if self.step_kind == "factor" else last + self.step
        return following > self.max_bytes or following <= last

    def at_size(self, size_bytes: int) -> AllReduceRow | None:
        """The row for exactly ``size_bytes`` (the last one when several), else None."""
        found = [r for r in self.rows if r.size_bytes == size_bytes]
        return found[-1] if found else None


_HEADER = re.compile(r"#\s*size\s+count\s+type\s+redop\b")
_OUT_OF_BOUNDS = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")
_AVG_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_RANK_LINE = re.compile(r"#\s*Rank\s+(\d+)\s(?:.*?\son\s+(\S+)\s+device\b)?")
_RUN_SETUP = re.compile(r"maxBytes\s+(\d+)\s+step:\s*(\d+)\((factor|bytes)\)")


def _number(token: str, what: str, row: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise ValueError(f"all_reduce_perf row has {what} {token!r}: {row.strip()[:120]!r}") from None


def _wrong(token: str, row: str) -> int | None:
    return None if token == "N/A" else int(_number(token, "#wrong", row))


def parse_all_reduce(text: str) -> AllReduceResult:
    """The result table of an ``all_reduce_perf`` run (any launcher prefix).

    Raises:
        ValueError: no result header, a header without ``busbw`` and ``#wrong`` (nccl-tests
            before 2.0 printed ``error``), or no result row (the test did not run; the first
            ``NCCL WARN`` / failure line is quoted, else the output's last line, e.g. the
            launcher's own refusal).
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _HEADER.search(line)), None)
    if start is None:
        failure = next((line.strip() for line in lines if "NCCL WARN" in line or "failure" in line.lower()), None)
        failure = failure or next((line.strip() for line in reversed(lines) if line.strip()), None)
        raise ValueError("no all_reduce_perf result table" + (f": {failure[:160]}" if failure else ""))
    header_line = lines[start]
    prefix = header_line[: header_line.index("#")]
    columns = header_line[len(prefix) :].lstrip("#").split()
    if columns.count("busbw") < 1 or "#wrong" not in columns:
        raise ValueError(f"unsupported all_reduce_perf header (no busbw and #wrong columns): {header_line.strip()!r}")
    busbw = [i for i, c in enumerate(columns) if c == "busbw"]
    wrong = [i for i, c in enumerate(columns) if c == "#wrong"]
    algbw = [i for i, c in enumerate(columns) if c == "algbw"]
    times = [i for i, c in enumerate(columns) if c in ("time", "cputime")]
    width = max(busbw + wrong + algbw + times) + 1
    rows, out_of_bounds, avg = [], None, None
    rank_lines = [m for line in lines[:start] if (m := _RANK_LINE.search(line))]
    ranks = len({m.group(1) for m in rank_lines}) or None
    hosts = _unique([m.group(2) for m in rank_lines if m.group(2)])
    setup = next((m for line in lines[:start] if (m := _RUN_SETUP.search(line))), None)
    warnings = tuple(line.strip() for line in lines if "NCCL WARN" in line)
    for line in lines[start + 1 :]:
        if prefix and not line.startswith(prefix):
            continue  # another rank's or tool's line interleaved
        body = line[len(prefix) :]
        if body.lstrip().startswith("#"):
            if match := _OUT_OF_BOUNDS.search(body):
                out_of_bounds = int(match.group(1))
            elif match := _AVG_BUSBW.search(body):
                avg = float(match.group(1))
            continue
        tokens = body.split()
        if len(tokens) < width or not tokens[0].isdigit():
            continue  # NCCL INFO lines and other chatter between rows
        two = len(busbw) > 1
        rows.append(
            AllReduceRow(
                size_bytes=int(tokens[0]),
                count=int(_number(tokens[1], "count", body)),
                dtype=tokens[2],
                redop=tokens[3],
                oop_time_us=_number(tokens[times[0]], "time", body),
                oop_algbw_gbps=_number(tokens[algbw[0]], "algbw", body),
                oop_busbw_gbps=_number(tokens[busbw[0]], "busbw", body),
                oop_wrong=_wrong(tokens[wrong[0]], body),
                ip_time_us=_number(tokens[times[1]], "time", body) if two else None,
                ip_algbw_gbps=_number(tokens[algbw[1]], "algbw", body) if two else None,
                ip_busbw_gbps=_number(tokens[busbw[1]], "busbw", body) if two else None,
                ip_wrong=_wrong(tokens[wrong[1]], body) if two and len(wrong) > 1 else None,
            )
        )
    if not rows:
        raise ValueError("all_reduce_perf printed its header but no result row (the test did not complete)")
    return AllReduceResult(
        tuple(rows),
        out_of_bounds,
        avg,
        ranks,
        hosts,
        int(setup.group(1)) if setup else None,
        int(setup.group(2)) if setup else None,
        setup.group(3) if setup else None,
        warnings,
    )


# ------------------------------------------------------------------------ NCCL network plugin
@dataclass(frozen=True)
class NcclNetInfo:
    """Network selection NCCL logged with ``NCCL_DEBUG=INFO``.

    Attributes:
        networks: names from ``Using network <name>`` (NCCL core), in order, deduplicated.
        loaded_plugins: names from ``Loaded net plugin <name>``.
        transports: ``NET/<name>`` prefixes seen (``OFI``, ``Socket``, ``IB``, ``GPUDirectTCPX``,
            ``FasTrak``, ``gIB``, ``Plugin``).
        no_plugin: NCCL said ``No plugin found`` (it uses its internal IB/Socket transports).
    """

    networks: tuple[str, ...]
    loaded_plugins: tuple[str, ...]
    transports: tuple[str, ...]
    no_plugin: bool


_USING_NETWORK = re.compile(r"NCCL INFO Using network (\S+(?: \S+)?)\s*$")
_LOADED_PLUGIN = re.compile(r"Loaded net plugin (.+?)(?:\s*\(v\d+\))?\s*$")
_TRANSPORT = re.compile(r"NCCL INFO NET/([A-Za-z][\w-]*)")


def _unique(values: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


#: NCCL found no network plugin: "No plugin found" (older NCCL, NVIDIA/nccl-tests#131) or, from
#: NCCL 2.2x, "NET/Plugin: Could not find: libnccl-net.so" (NCCL 2.28.9 on an H100,
#: tests/fixtures/health/nccl_info_socket_h100_gpuinfra_device.txt).
_NO_NET_PLUGIN = re.compile(r"No plugin found|NET/Plugin: Could not find: libnccl-net")


def parse_nccl_net(text: str) -> NcclNetInfo:
    """Which network transport NCCL chose, from its ``NCCL INFO`` lines.

    Raises:
        ValueError: no ``NCCL INFO`` line (the run did not set ``NCCL_DEBUG=INFO``).
    """
    info = [line for line in text.splitlines() if "NCCL INFO" in line]
    if not info:
        raise ValueError("no `NCCL INFO` lines: run all_reduce_perf with NCCL_DEBUG=INFO")
    networks = [m.group(1).strip() for line in info if (m := _USING_NETWORK.search(line))]
    plugins = [m.group(1).strip() for line in info if (m := _LOADED_PLUGIN.search(line))]
    transports = [m.group(1) for line in info if (m := _TRANSPORT.search(line))]
    return NcclNetInfo(
        _unique(networks), _unique(plugins), _unique(transports), any(_NO_NET_PLUGIN.search(line) for line in info)
    )


# ---------------------------------------------------------------------------- fabric manager
#: ``ActiveState`` values ``systemctl is-active`` prints (systemctl(1), org.freedesktop.systemd1).
UNIT_STATES = (
    "active",
    "reloading",
    "inactive",
    "failed",
    "activating",
    "deactivating",
    "maintenance",
    "refreshing",
    "unknown",
)


@dataclass(frozen=True)
class UnitState:
    """``systemctl is-active <unit>``: ``state`` is one of :data:`UNIT_STATES`."""

    state: str

    @property
    def active(self) -> bool:
        """The unit runs."""
        return self.state == "active"


def parse_unit_state(text: str) -> UnitState:
    """The state word ``systemctl is-active`` prints.

    Raises:
        ValueError: empty, or not one of :data:`UNIT_STATES`.
    """
    words = text.split()
    if not words or words[0] not in UNIT_STATES:
        raise ValueError(f"not `systemctl is-active` output: {text.strip()[:80]!r}")
    return UnitState(words[0])
