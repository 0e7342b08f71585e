"""The agent never stops trying to end its node, and GPU faults, a missing health verdict and
hung jobs end it: the decision logic with fake GPUs, clocks and end calls."""

from __future__ import annotations

import os
import stat
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuinfra.agent import watch as w
from gpuinfra.agent.node import Agent, AgentConfig, NvmlGpus, main
from gpuinfra.health import node as health_node

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class Clock:
    """Monotonic and wall clock together (``advance`` moves both)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def now(self):
        return NOW + timedelta(seconds=self.t - 1000.0)

    def advance(self, seconds):
        self.t += seconds


class Gpus:
    def __init__(self, *values):
        self.values, self.error = list(values), None

    def utilizations(self):
        if self.error:
            raise self.error
        return list(self.values)


class NoMetadata:
    def interruption(self):
        return None

    def expires_at(self):
        return None


class Calls:
    """An end call that records (clock time, name) and fails its first ``failures`` calls."""

    def __init__(self, clock, name, log, failures=10**6):
        self.clock, self.name, self.log, self.failures = clock, name, log, failures

    def __call__(self, reason):
        self.log.append((self.clock() - 1000.0, self.name, reason))
        if len([c for c in self.log if c[1] == self.name]) <= self.failures:
            raise subprocess.CalledProcessError(1, [self.name])


def config(tmp_path, **kw):
    values = dict(
        cloud="gcp",
        stack="t",
        bucket="b",
        expires_at=None,
        idle_timeout_seconds=60,
        idle_utilization_percent=5,
        checkpoint_dir=tmp_path / "ckpt",
        gpu_count=2,
    )
    values.update(kw)
    return AgentConfig(**values)


def agent(tmp_path, clock, gpus, end_node, **kw):
    return Agent(
        kw.pop("config", None) or config(tmp_path),
        gpus,
        NoMetadata(),
        None,
        end_node,
        clock=clock,
        now=clock.now,
        **kw,
    )


def run(a, clock, seconds, every=5):
    """Poll every ``every`` s for ``seconds``; the states seen."""
    states = []
    for _ in range(int(seconds // every)):
        states.append(a.step())
        clock.advance(every)
    return states


def test_a_failing_gcp_end_call_is_retried_with_backoff_then_shutdown_and_the_call_take_turns(tmp_path):
    clock, log = Clock(), []
    a = agent(
        tmp_path, clock, Gpus(0, 0), Calls(clock, "api", log), power_off=Calls(clock, "shutdown", log), config=None
    )
    states = run(a, clock, 1300)
    # idle from t=0, ended at t=60; tries 5, 10, 20, 40 s apart, then shutdown, 80, 160, 300 s...
    assert [(t, name) for t, name, _ in log] == [
        (60, "api"),
        (65, "api"),
        (75, "api"),
        (95, "api"),
        (135, "api"),
        (215, "shutdown"),
        (375, "api"),
        (675, "shutdown"),
        (975, "api"),
        (1275, "shutdown"),
    ]
    assert {reason for _, _, reason in log} == {"idle"}
    assert set(states[12:]) == {"idle"}  # the loop keeps polling: main() never returns
    assert sum("relying on the cloud backstop" in e for e in a.events) == 1


def test_an_end_call_that_fails_three_times_succeeds_on_the_fourth_and_is_not_repeated_for_300_s(tmp_path):
    clock, log = Clock(), []
    a = agent(
        tmp_path, clock, Gpus(0, 0), Calls(clock, "api", log, failures=3), power_off=Calls(clock, "shutdown", log)
    )
    run(a, clock, 400)
    assert [(t, name) for t, name, _ in log] == [(60, "api"), (65, "api"), (75, "api"), (95, "api"), (395, "api")]


def test_aws_has_no_separate_power_off_and_every_try_is_the_instance_initiated_shutdown(tmp_path):
    clock, log = Clock(), []
    a = agent(tmp_path, clock, Gpus(0, 0), Calls(clock, "shutdown", log), config=config(tmp_path, cloud="aws"))
    run(a, clock, 220)
    assert [(t, name) for t, name, _ in log] == [
        (60, "shutdown"),
        (65, "shutdown"),
        (75, "shutdown"),
        (95, "shutdown"),
        (135, "shutdown"),
        (215, "shutdown"),
    ]


def test_the_checkpoints_are_synced_once_however_many_end_tries(tmp_path, monkeypatch):
    clock, log, syncs = Clock(), [], []
    a = agent(tmp_path, clock, Gpus(0, 0), Calls(clock, "api", log))
    monkeypatch.setattr(a, "save_checkpoints", lambda seconds: syncs.append(seconds) or [])
    run(a, clock, 300)
    assert len(log) > 3 and syncs == [300]


def test_unreadable_gpus_are_a_fault_after_60_s_not_busy(tmp_path):
    clock, ended = Clock(), []
    gpus = Gpus(90, 90)
    a = agent(tmp_path, clock, gpus, ended.append)
    gpus.error = subprocess.CalledProcessError(6, ["nvidia-smi"], "No devices were found")
    assert set(run(a, clock, 60)) == {"running"} and not ended
    assert a.step() == "gpu-fault" and ended == ["gpu-fault"]
    assert any("GPU fault: CalledProcessError(6" in e and "for 60 s" in e for e in a.events), a.events


def test_a_read_failure_that_clears_is_no_fault(tmp_path):
    clock, ended = Clock(), []
    gpus = Gpus(90, 90)
    a = agent(tmp_path, clock, gpus, ended.append)
    gpus.error = subprocess.TimeoutExpired(["nvidia-smi"], 30)
    run(a, clock, 55)
    gpus.error = None
    assert a.step() == "running"
    gpus.error = subprocess.TimeoutExpired(["nvidia-smi"], 30)
    assert set(run(a, clock, 55)) == {"running"} and not ended


def test_fewer_gpus_than_the_node_has_is_a_fault(tmp_path):
    clock, ended = Clock(), []
    a = agent(tmp_path, clock, Gpus(90), ended.append)  # one of two GPUs left
    run(a, clock, 65)
    assert ended == ["gpu-fault"] and any("1 GPUs visible" in e for e in a.events)


def test_no_verdict_within_the_bound_fails_the_gate_and_the_idle_clock_ends_the_node(tmp_path):
    clock, ended, state = Clock(), [], tmp_path / "run"
    c = config(tmp_path, health_gate="enforce", verdict_wait_seconds=600)
    a = agent(tmp_path, clock, Gpus(0, 0), ended.append, config=c, state_dir=state)
    assert set(run(a, clock, 600)) == {"starting"} and not (state / health_node.FAILED_MARK).exists()
    assert a.step() == "running"  # the gate counts as failed now; the idle clock starts
    assert (state / health_node.FAILED_MARK).read_text() == "no health verdict within 600 s of the agent's start\n"
    run(a, clock, 60)
    assert a.step() == "idle" and ended == ["idle"]


def test_the_verdict_bound_counts_from_the_first_start_across_agent_restarts(tmp_path):
    clock, ended, state = Clock(), [], tmp_path / "run"
    c = config(tmp_path, health_gate="enforce", verdict_wait_seconds=600)
    agent(tmp_path, clock, Gpus(0, 0), ended.append, config=c, state_dir=state).step()
    clock.advance(590)
    restarted = agent(tmp_path, clock, Gpus(0, 0), ended.append, config=c, state_dir=state)
    assert restarted.step() == "starting"
    clock.advance(10)
    assert restarted.step() == "running" and (state / health_node.FAILED_MARK).exists()


def test_a_node_the_gate_left_out_ends_once_the_ranks_are_decided(tmp_path):
    clock, ended, state = Clock(), [], tmp_path / "run"
    state.mkdir()
    (state / health_node.FAILED_MARK).write_text("ecc: 2 uncorrectable\n")
    (state / health_node.EXCLUDED_MARK).write_text("ecc: 2 uncorrectable\n")
    c = config(tmp_path, health_gate="enforce", verdict_wait_seconds=6000)
    a = agent(tmp_path, clock, Gpus(0, 0), ended.append, config=c, state_dir=state)
    assert set(run(a, clock, 300)) == {"starting"} and not ended
    (state / health_node.RANKS_DECIDED_MARK).write_text("")
    assert a.step() == "excluded" and ended == ["excluded"]


def test_a_node_the_gate_left_out_ends_at_the_verdict_bound_when_no_ranks_come(tmp_path):
    clock, ended, state = Clock(), [], tmp_path / "run"
    state.mkdir()
    (state / health_node.EXCLUDED_MARK).write_text("ecc\n")
    c = config(tmp_path, health_gate="enforce", verdict_wait_seconds=100)
    a = agent(tmp_path, clock, Gpus(0, 0), ended.append, config=c, state_dir=state)
    assert set(run(a, clock, 100)) == {"starting"}
    assert a.step() == "excluded" and ended == ["excluded"]


def test_the_agent_reads_the_marks_the_health_gate_writes():
    source = Path(Agent.__module__.replace(".", "/") + ".py")
    text = (Path(__file__).resolve().parents[2] / source).read_text()
    for mark in (health_node.PASSED_MARK, health_node.FAILED_MARK, health_node.EXCLUDED_MARK):
        assert f'"{mark}"' in text
    assert f'"{health_node.RANKS_DECIDED_MARK}"' in text


def test_main_keeps_polling_after_the_node_started_ending(tmp_path, monkeypatch):
    from gpuinfra.agent import node

    polls = []

    class Ending:
        def step(self):
            polls.append(1)
            if len(polls) == 1:
                raise RuntimeError("boom")
            return "expired"

    class Stop(Exception):
        pass

    def sleep(seconds):
        if len(polls) == 5:
            raise Stop

    import threading

    handlers, syncing = [], threading.Event()
    monkeypatch.setattr(node, "build_agent", lambda config, state_dir, poll_seconds: Ending())
    monkeypatch.setattr(node.time, "sleep", sleep)
    # the SIGTERM sync and the background sync are set up, not run (not in the test process)
    monkeypatch.setattr(node.signal, "signal", lambda signum, handler: handlers.append(signum))
    monkeypatch.setattr(node, "keep_syncing", lambda agent: syncing.set())
    env = tmp_path / "node.env"
    env.write_text(
        "GPUINFRA_CLOUD=aws\nGPUINFRA_STACK=t\nGPUINFRA_BUCKET=b\nGPUINFRA_IDLE_TIMEOUT_MINUTES=30\n"
        "GPUINFRA_IDLE_GPU_UTILIZATION_PERCENT=5\n"
    )
    with pytest.raises(Stop):
        main(["--config", str(env), "--state-dir", str(tmp_path / "run")])
    assert len(polls) == 5  # a crash and four "expired" polls, and still polling
    assert handlers == [node.signal.SIGTERM] and syncing.wait(5)


# ------------------------------------------------------------------ the job watch


def watched(tmp_path, clock, gpus, ended, env, kernel="", power=None):
    c = config(tmp_path, env=env)
    log = tmp_path / "kmsg"
    log.write_text(kernel)
    reader = w.KernelLog(str(log))
    a = agent(tmp_path, clock, gpus, ended.append, config=c, state_dir=tmp_path / "run")
    a.watch = lambda agent: w.Watch(agent, reader, power or (lambda: [(70.0, 700.0)] * 2))
    return a, log


XID_79 = "NVRM: Xid (PCI:0000:53:00): 79, pid=1912, name=python, GPU has fallen off the bus."


def test_a_fatal_xid_ends_the_node_at_once(tmp_path):
    clock, ended = Clock(), []
    a, log = watched(tmp_path, clock, Gpus(90, 90), ended, {}, kernel="6,1,2,-;NVRM: loading NVIDIA UNIX driver\n")
    assert a.step() == "running"
    with open(log, "a") as f:
        f.write(f"4,900,123456789,-;{XID_79}\n")
    assert a.step() == "gpu-fault" and ended == ["gpu-fault"]
    assert any(f"GPU fault: {XID_79}" in e for e in a.events)


@pytest.mark.parametrize("xid", [13, 31, 43, 63, 94])
def test_xids_the_catalog_resolves_without_a_reset_do_not_end_the_node(tmp_path, xid):
    # 13/31/43/94: RESTART_APP or IGNORE; 63: row remapping event, IGNORE
    clock, ended = Clock(), []
    line = f"4,9,1,-;NVRM: Xid (PCI:0000:53:00): {xid}, pid=1912, name=python, Ch 00000008\n"
    a, _ = watched(tmp_path, clock, Gpus(90, 90), ended, {}, kernel=line)
    assert set(run(a, clock, 30)) == {"running"} and not ended


def test_the_kernel_log_reader_returns_only_new_records(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("6,1,1,-;one\n")
    reader = w.KernelLog(str(path))
    assert reader() == "6,1,1,-;one\n" and reader() == ""
    with open(path, "a") as f:
        f.write("6,2,2,-;two\n")
    assert reader() == "6,2,2,-;two\n"
    with pytest.raises(FileNotFoundError):
        w.KernelLog(str(tmp_path / "absent"))()


def test_a_hang_at_full_utilization_and_10_percent_power_alerts_once_and_clears(tmp_path):
    clock, ended = Clock(), []
    power = [[(70.0, 700.0)] * 2]
    env = {"GPUINFRA_HANG_ACTION": "alert", "GPUINFRA_HANG_MINUTES": "30", "GPUINFRA_HANG_POWER_PERCENT": "20"}
    a, _ = watched(tmp_path, clock, Gpus(100, 100), ended, env, power=lambda: power[0])
    states = run(a, clock, 1800 + 10)
    assert set(states[:360]) == {"running"} and set(states[360:]) == {"hung"} and not ended
    alerts = [e for e in a.events if e.startswith(w.HANG_MARKER)]
    assert alerts == [f"{w.HANG_MARKER} every GPU busy under 20% of its power limit for 30 min"]
    assert (tmp_path / "run" / "hang").read_text() == "every GPU busy under 20% of its power limit for 30 min\n"
    power[0] = [(450.0, 700.0), (70.0, 700.0)]  # one GPU computes again
    assert a.step() == "running" and not (tmp_path / "run" / "hang").exists()


def test_a_hang_with_action_end_syncs_and_ends_the_node(tmp_path):
    clock, ended = Clock(), []
    env = {"GPUINFRA_HANG_ACTION": "end", "GPUINFRA_HANG_MINUTES": "5", "GPUINFRA_HANG_POWER_PERCENT": "25"}
    a, _ = watched(tmp_path, clock, Gpus(100, 100), ended, env)
    run(a, clock, 300)
    assert a.step() == "hang" and ended == ["hang"]


def test_no_power_threshold_in_node_env_means_no_power_sign(tmp_path):
    clock, ended = Clock(), []
    env = {"GPUINFRA_HANG_ACTION": "end", "GPUINFRA_HANG_MINUTES": "5"}
    a, _ = watched(tmp_path, clock, Gpus(100, 100), ended, env)  # 70 W of 700 W by default
    assert set(run(a, clock, 3600)) == {"running"} and not ended


@pytest.mark.parametrize(
    "power",
    [
        [(450.0, 700.0)] * 2,  # computing
        [(None, None)] * 2,  # [N/A]: no power reading, no sign
        [(70.0, 700.0)],  # one reading for two GPUs
    ],
)
def test_no_hang_without_every_gpu_at_low_power(tmp_path, power):
    clock, ended = Clock(), []
    env = {"GPUINFRA_HANG_ACTION": "end", "GPUINFRA_HANG_POWER_PERCENT": "25"}
    a, _ = watched(tmp_path, clock, Gpus(100, 100), ended, env, power=lambda: power)
    assert set(run(a, clock, 3600)) == {"running"} and not ended


def test_a_stale_progress_file_is_a_hang_and_a_fresh_one_is_not(tmp_path):
    clock, ended = Clock(), []
    progress = tmp_path / "progress"
    progress.write_text("")
    env = {"GPUINFRA_HANG_ACTION": "end", "GPUINFRA_HANG_MINUTES": "10", "GPUINFRA_PROGRESS_FILE": str(progress)}
    a, _ = watched(tmp_path, clock, Gpus(100, 100), ended, env, power=lambda: [(450.0, 700.0)] * 2)
    touched = clock.now().timestamp()
    os.utime(progress, (touched, touched))
    assert set(run(a, clock, 595)) == {"running"}
    os.utime(progress, (clock.now().timestamp(), clock.now().timestamp()))  # the job moves on
    assert set(run(a, clock, 595)) == {"running"} and not ended
    run(a, clock, 10)
    assert ended == ["hang"] and any("not touched for 10 min" in e for e in a.events)


def test_the_watch_loads_once_the_bundle_is_in(tmp_path):
    clock, ended, tries = Clock(), [], []

    def factory(agent):
        tries.append(1)
        if len(tries) < 3:
            raise ModuleNotFoundError("No module named 'gpuinfra.agent.watch'")
        return w.Watch(agent, lambda: XID_79, list)

    a = agent(tmp_path, clock, Gpus(90, 90), ended.append, watch=factory)
    assert run(a, clock, 10) == ["running", "running"] and not ended
    assert a.step() == "gpu-fault" and len(tries) == 3


def _fake_tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_nvidia_smi_no_devices_raises_and_power_parses_not_supported(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr("gpuinfra.agent.node.NvmlGpus.__init__", lambda self: setattr(self, "_nvml", None))
    _fake_tool(tmp_path, "nvidia-smi", 'echo "No devices were found"; exit 6\n')
    with pytest.raises(subprocess.CalledProcessError):
        NvmlGpus().utilizations()
    _fake_tool(
        tmp_path,
        "nvidia-smi",
        # the power line an idle H100 80GB HBM3 printed (driver 580.159.04), then a GPU without readings
        'case "$1" in --query-gpu=power*) printf "72.12, 700.00\\n[N/A], [N/A]\\n" ;; '
        '*) printf "100\\n100\\n" ;; esac\n',
    )
    assert NvmlGpus().utilizations() == [100, 100]
    assert w.gpu_power() == [(72.12, 700.0), (None, None)]
