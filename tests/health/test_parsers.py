"""Parsers on real recorded outputs (sources in tests/fixtures/health/*.source), failing cases
included; `_derived` fixtures are real outputs with one or two values edited, as their .source says."""

from __future__ import annotations

import re

import pytest

from gpuinfra.health import parsers as p
from tests.health.conftest import FIXTURES, fixture_text


def test_every_fixture_names_its_source():
    for path in FIXTURES.iterdir():
        if path.suffix != ".source":
            note = path.with_name(path.name + ".source")
            assert note.is_file(), f"{path.name} has no .source file"
            text = note.read_text()
            # a public page, a derivation of one, or a capture on this project's GPU machine
            assert (
                "https://" in text or "DERIVED from" in text or "captured by benchmarks/capture_node_health.py" in text
            )
            assert ("DERIVED" in text) == ("_derived" in path.name)


# ---------------------------------------------------------------------------- all_reduce_perf
@pytest.mark.parametrize(
    "name, rows, size_2g_busbw, largest, largest_busbw, oob, avg",
    [
        # 2 x p5.48xlarge under Slurm ("0: " prefix), table only
        ("all_reduce_p5_2node_awsome_slurm.txt", 32, 443.72, 17179869184, 487.09, None, None),
        # 2 x p5.48xlarge on AWS Batch ("[1,0]<stdout>:" prefix), with footer
        ("all_reduce_p5_2node_awsome_batch.txt", 32, 444.02, 17179869184, 483.05, 0, 156.742),
        # 2 x p4de.24xlarge under Slurm
        ("all_reduce_p4de_2node_awsome_slurm.txt", 29, 78.33, 2147483648, 78.33, None, None),
        # 2 x a3-highgpu-8g (TCPX), Google's example, no prefix, validation off (#wrong N/A)
        ("all_reduce_a3high_2node_gcp_tcpx.txt", 14, 88.18, 8589934592, 89.54, 0, 49.6371),
        # 2 x 8 H100 on a3-mega, with the "# Using devices" rank list
        ("all_reduce_a3mega_2node_ztan.txt", 31, 318.40, 8589934592, 338.82, 0, 70.742),
    ],
)
def test_all_reduce_tables(name, rows, size_2g_busbw, largest, largest_busbw, oob, avg):
    run = p.parse_all_reduce(fixture_text(name))
    assert len(run.rows) == rows
    assert run.at_size(2147483648).oop_busbw_gbps == size_2g_busbw
    assert (run.largest.size_bytes, run.largest.oop_busbw_gbps) == (largest, largest_busbw)
    assert (run.out_of_bounds, run.avg_busbw_gbps) == (oob, avg)
    assert run.wrong_rows == ()


def test_all_reduce_row_fields_and_rank_count():
    run = p.parse_all_reduce(fixture_text("all_reduce_a3mega_2node_ztan.txt"))
    assert run.ranks == 16 and run.validated
    assert run.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    assert (run.max_bytes, run.step, run.step_kind, run.has_footer, run.sizes_done) == (
        8589934592,
        2,
        "factor",
        True,
        True,
    )
    first = run.rows[0]
    assert (first.size_bytes, first.count, first.dtype, first.redop) == (8, 2, "float", "sum")
    assert (first.oop_time_us, first.oop_algbw_gbps, first.oop_busbw_gbps, first.oop_wrong) == (135.8, 0.0, 0.0, 0)
    assert (first.ip_time_us, first.ip_busbw_gbps, first.ip_wrong) == (123.5, 0.0, 0)


def test_all_reduce_full_log_of_a_real_efa_run():
    """2 x g4dn.metal, one GPU each (aws-ia/terraform-aws-eks-blueprints): rank list, NCCL INFO lines
    of both ranks interleaved with the table, zero-byte rows, footer."""
    run = p.parse_all_reduce(fixture_text("all_reduce_g4dnmetal_2node_1gpu_eksblueprints.txt"))
    assert (run.ranks, run.hosts) == (2, ("test-nccl-efa-worker-0", "test-nccl-efa-worker-1"))
    assert (len(run.rows), run.rows[0].size_bytes, run.largest.size_bytes) == (31, 0, 1073741824)
    assert (run.out_of_bounds, run.avg_busbw_gbps, run.warnings) == (0, 1.15327, ())
    assert (run.max_bytes, run.sizes_done, run.has_footer) == (1073741824, True, True)
    net = p.parse_nccl_net(fixture_text("all_reduce_g4dnmetal_2node_1gpu_eksblueprints.txt"))
    assert net.networks == ("AWS Libfabric",) and "OFI" in net.transports


def test_all_reduce_truncated_run():  # derived: the ztan run cut after the 1 GiB row
    run = p.parse_all_reduce(fixture_text("all_reduce_a3mega_2node_truncated_derived.txt"))
    assert (run.largest.size_bytes, run.has_footer, run.sizes_done, run.ranks) == (1073741824, False, False, 16)
    assert run.at_size(2147483648) is None


def test_all_reduce_excerpt_without_setup_line_and_warnings():
    run = p.parse_all_reduce(fixture_text("all_reduce_p5_2node_batch_ranks_derived.txt"))
    assert (run.ranks, run.max_bytes, run.sizes_done, run.has_footer) == (16, None, None, True)
    warned = p.parse_all_reduce(
        "h:1:2 [3] NCCL WARN NET/OFI Request 0x1 completed with error\n"
        + fixture_text("all_reduce_a3mega_2node_ztan.txt")
    )
    assert warned.warnings == ("h:1:2 [3] NCCL WARN NET/OFI Request 0x1 completed with error",)
    # the older rank line format (no Group column) is counted too
    old = p.parse_all_reduce(
        "#   Rank  0 Pid     25 on nccl-tests-efa-16-worker-0 device  0 [0x10] A100-SXM4-40GB\n"
        + fixture_text("all_reduce_p5_2node_awsome_batch.txt")
    )
    assert (old.ranks, old.hosts) == (1, ("nccl-tests-efa-16-worker-0",))


def test_all_reduce_without_validation_reports_wrong_as_none():
    run = p.parse_all_reduce(fixture_text("all_reduce_a3high_2node_gcp_tcpx.txt"))
    assert not run.validated and {r.oop_wrong for r in run.rows} == {None}
    assert run.ranks is None


def test_all_reduce_wrong_elements_are_found():  # derived: #wrong 12 on the 1 GiB row
    run = p.parse_all_reduce(fixture_text("all_reduce_p5_2node_wrong_derived.txt"))
    assert [(r.size_bytes, r.oop_wrong, r.ip_wrong) for r in run.wrong_rows] == [(1073741824, 12, 0)]
    assert run.out_of_bounds == 12


def test_all_reduce_low_bandwidth_row():  # derived: the 2 GiB row edited to 301.44 GB/s
    run = p.parse_all_reduce(fixture_text("all_reduce_p5_2node_lowbw_derived.txt"))
    assert run.at_size(2147483648).oop_busbw_gbps == 301.44


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no all_reduce_perf result table"),
        (  # the launcher refused before the test ran: its last line says why
            "gpuinfra-run: waiting for ranks\ngpuinfra-run: EFA is not ready on this node, missing: 32 of 32 devices\n\n",
            "no all_reduce_perf result table: gpuinfra-run: EFA is not ready on this node, missing: 32 of 32 devices",
        ),
        (
            "host:1:1 [0] NCCL WARN NET/OFI Unable to register memory\n",
            "no all_reduce_perf result table: host:1:1 [0] NCCL WARN NET/OFI Unable to register memory",
        ),
        (
            "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n",
            "unsupported all_reduce_perf header (no busbw and #wrong columns)",
        ),
        (
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw "
            "#wrong\n",
            "all_reduce_perf printed its header but no result row",
        ),
        (
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw "
            "#wrong\n           8             2     float     sum      -1    69.12    0.00    fast      0    72.43    0.00    "
            "0.00      0\n",
            "all_reduce_perf row has busbw 'fast'",
        ),
    ],
)
def test_all_reduce_refuses_what_it_cannot_read(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        p.parse_all_reduce(text)


# ------------------------------------------------------------------------------ nvidia-smi
def test_nvidia_smi_query_8xh100():
    gpus = p.parse_nvidia_smi_query(fixture_text("nvidia_smi_query_gpu_8xH100_virtualclient.csv"))
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.ecc_uncorrected_volatile for g in gpus} == {0} and {g.ecc_corrected_volatile for g in gpus} == {0}
    assert gpus[0].uuid is None  # not queried in that recording


def test_nvidia_smi_query_of_a_real_h100():  # captured on the lent GPU machine, driver 580.159.04
    gpus = p.parse_nvidia_smi_query(fixture_text("nvidia_smi_query_gpu_1xH100_gpuinfra_device.csv"))
    assert [(g.index, g.name, g.uuid, g.ecc_corrected_volatile, g.ecc_uncorrected_volatile) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "GPU-9aa03655-fa81-3c7d-b494-58ee97d11735", 0, 0)
    ]
    assert p.has_ecc_column(fixture_text("nvidia_smi_query_gpu_1xH100_gpuinfra_device.csv"))


def test_nvidia_smi_query_ecc_errors():  # derived: GPU 3 has 2 uncorrectable errors
    gpus = p.parse_nvidia_smi_query(fixture_text("nvidia_smi_query_gpu_8xH100_ecc_derived.csv"))
    assert [(g.index, g.ecc_uncorrected_volatile) for g in gpus if g.ecc_uncorrected_volatile] == [(3, 2)]


def test_nvidia_smi_query_na_units_and_no_devices():
    text = (
        "index, name, uuid, ecc.errors.uncorrected.volatile.total, memory.total [MiB]\n"
        "0, Tesla T4, GPU-1, [N/A], 15360 MiB\n"
    )
    (gpu,) = p.parse_nvidia_smi_query(text)
    assert (gpu.index, gpu.name, gpu.uuid, gpu.ecc_uncorrected_volatile) == (0, "Tesla T4", "GPU-1", None)
    assert p.parse_nvidia_smi_query("No devices were found\n") == ()


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "nvidia-smi printed nothing"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
            "nvidia-smi output has no CSV header with index and name",
        ),
        ("index, name\n0, A, extra\n", "nvidia-smi CSV line 2 has 3 fields, the header 2"),
        (
            "index, name, ecc.errors.uncorrected.volatile.total\n0, A, many\n",
            "nvidia-smi: ecc.errors.uncorrected.volatile.total is 'many', not a number",
        ),
    ],
)
def test_nvidia_smi_query_refuses(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        p.parse_nvidia_smi_query(text)


# ---------------------------------------------------------------------------------- nvlink
def test_nvlink_all_links_up_on_p4de():
    (gpu,) = p.parse_nvlink_status(fixture_text("nvlink_status_p4de_gpu0_awsome.txt"))
    assert (gpu.gpu, gpu.name, len(gpu.links), gpu.inactive) == (0, "NVIDIA A100-SXM4-80GB", 12, ())
    assert {link.gbps for link in gpu.links} == {25.0}


def test_nvlink_inactive_links_on_v100():
    (gpu,) = p.parse_nvlink_status(fixture_text("nvlink_status_v100_inactive_azhpc73.txt"))
    assert (gpu.gpu, gpu.name, gpu.inactive) == (3, "Tesla V100-SXM2-32GB", (3, 5))
    assert [link.gbps for link in gpu.links] == [25.781, 25.781, 25.781, None, 25.781, None]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "lists no GPU"),
        ("  Link 0: 25 GB/s\n", "Link line before any GPU line"),
        (
            "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5)\n         Link 0: Data Tx: 1040 KiB\n",
            "not `nvidia-smi nvlink -s` output",
        ),
    ],
)
def test_nvlink_refuses(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        p.parse_nvlink_status(text)


# --------------------------------------------------------------------------------- fi_info
@pytest.mark.parametrize(
    "name, devices, entries",
    [
        ("fi_info_p4d_awsdocs.txt", ("efa_0", "efa_1", "efa_2", "efa_3"), 4),
        ("fi_info_single_efa_libfabric5689.txt", ("efa_0",), 3),  # rdm + dgrm + ofi_rxd: one device
        ("fi_info_p4d_missing_one_derived.txt", ("efa_0", "efa_1", "efa_2"), 3),
    ],
)
def test_fi_info_counts_distinct_devices(name, devices, entries):
    efa = p.parse_fi_info(fixture_text(name))
    assert (efa.devices, efa.count, efa.entries, efa.error) == (devices, len(devices), entries, None)


def test_fi_info_rdmap_names_and_efa_direct_fabric():
    text = (
        "provider: efa\n    fabric: efa-direct\n    domain: rdmap16s27-rdm\n    type: FI_EP_RDM\n"
        "provider: efa\n    fabric: efa\n    domain: rdmap16s27-rdm\n    type: FI_EP_RDM\n"
        "provider: efa\n    fabric: efa\n    domain: rdmap32s27-dgrm\n    type: FI_EP_DGRAM\n"
    )
    assert p.parse_fi_info(text).devices == ("rdmap16s27", "rdmap32s27")


def test_fi_info_no_device_and_garbage():
    efa = p.parse_fi_info("fi_getinfo: -61\n")  # -FI_ENODATA: no EFA device
    assert (efa.count, efa.error) == (0, "fi_getinfo: -61")
    with pytest.raises(ValueError, match="not `fi_info -p efa` output"):
        p.parse_fi_info("bash: fi_info: command not found\n")


# ----------------------------------------------------------------------------- NCCL network
@pytest.mark.parametrize(
    "name, networks, plugins, transports, no_plugin",
    [
        ("nccl_info_efa_awsome_fsdp.txt", (), (), ("OFI",), False),
        ("nccl_info_efa_awsdocs.txt", (), (), ("OFI",), False),
        ("nccl_info_tcpx_skypilot.txt", (), (), ("GPUDirectTCPX",), False),
        ("nccl_info_no_plugin_nccltests131.txt", ("Socket",), (), ("Plugin", "Socket"), True),
        ("nccl_info_efa_p4d_awsefaeks.txt", ("AWS Libfabric",), (), ("OFI", "Plugin"), False),
        # NCCL 2.28.9 on one H100 without a net plugin (captured on the lent GPU machine, 2026-11-23)
        ("nccl_info_socket_h100_gpuinfra_device.txt", ("Socket",), (), ("Plugin", "IB", "Socket"), True),
    ],
)
def test_nccl_network_lines(name, networks, plugins, transports, no_plugin):
    net = p.parse_nccl_net(fixture_text(name))
    assert (net.networks, net.loaded_plugins, net.transports, net.no_plugin) == (
        networks,
        plugins,
        transports,
        no_plugin,
    )


def test_nccl_network_names_and_loaded_plugin():
    net = p.parse_nccl_net(
        "h:1:2 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v8)\n"
        "h:1:2 [0] NCCL INFO Using network AWS Libfabric\n"
        "h:1:2 [1] NCCL INFO Using network AWS Libfabric\n"
    )
    assert (net.networks, net.loaded_plugins) == (("AWS Libfabric",), ("AWS Libfabric",))
    with pytest.raises(ValueError, match="no `NCCL INFO` lines"):
        p.parse_nccl_net(fixture_text("all_reduce_p5_2node_awsome_slurm.txt"))


# -------------------------------------------------------------------------- fabric manager
@pytest.mark.parametrize(
    "text, state, active",
    [("active\n", "active", True), ("failed\n", "failed", False), ("inactive\n", "inactive", False)],
)
def test_unit_state(text, state, active):
    assert (p.parse_unit_state(text).state, p.parse_unit_state(text).active) == (state, active)


def test_unit_state_refuses_other_text():
    with pytest.raises(ValueError, match="not `systemctl is-active` output"):
        p.parse_unit_state("Unit nvidia-fabricmanager.service could not be found.\n")
