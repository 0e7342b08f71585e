"""The node boot manifest (gpuinfra/plan/boot.py) and its two writers: every unit and file of
the manifest reaches each cloud's boot text exactly once, the start order and unit ordering
hold on both clouds, and user values cannot change the meaning of a unit file or a script."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gpuinfra.errors import ExitCode, SpecError, UnitValueError
from gpuinfra.plan.aws import plan_aws_cluster
from gpuinfra.plan.boot import AGENT_UNIT, PREPULL_UNIT, SCRATCH_UNIT, prepull_unit
from gpuinfra.plan.boot_aws import aws_node_boot, aws_node_bundle, cloud_config, nccl_env, render_user_data
from gpuinfra.plan.boot_gcp import gcp_node_boot, gcp_node_bundle, render_startup_script, startup_script
from gpuinfra.plan.gcp import plan_gcp_cluster
from gpuinfra.plan.units import NodeFile, SystemdUnit, check_path, command, shell, systemd_quote
from gpuinfra.spec import ClusterSpec
from gpuinfra.stackfile import read_stack_spec
from tests.blueprints.helpers import gcp_script_files, make_spec, need_tool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"aws": "example-p5-2nodes", "gcp": "example-a3mega-2nodes"}
HEALTH_PATH = "/etc/systemd/system/gpuinfra-health.service"
EVIL_IMAGES = [
    "nvcr.io/nvidia/pytorch:25.01-py3 && touch /tmp/PWNED",
    "nvcr.io/nvidia/pytorch:25.01-py3\nx: y",
    "nvcr.io/nvidia/pytorch:$(id)",
    "nvcr.io/nvidia/pytorch:25.01-py3'; touch /tmp/x; '",
    "-v/:/host",
]


def _boot_and_text(cloud: str, spec=None):
    """(manifest, rendered boot text, node bundle) of ``spec`` (the cloud's example stack)."""
    spec = spec or read_stack_spec(ROOT, EXAMPLES[cloud])
    if cloud == "aws":
        plan = plan_aws_cluster(spec)
        return aws_node_boot(spec, plan, "bkt"), render_user_data(spec, plan, "bkt"), aws_node_bundle(spec, plan)
    plan = plan_gcp_cluster(spec)
    return gcp_node_boot(spec, plan, "bkt"), render_startup_script(spec, plan, "bkt"), gcp_node_bundle(spec, plan)


def _written_files(cloud: str, text: str) -> list[tuple[str, str, str]]:
    """(path, mode, content) of every file the boot text writes, in order, duplicates kept."""
    if cloud == "aws":
        return [(f["path"], f.get("permissions", "0644"), f["content"]) for f in yaml.safe_load(text)["write_files"]]
    return [(path, mode, content) for path, (mode, content) in gcp_script_files(text).items()]


def _starts(cloud: str, text: str) -> list[list[str]]:
    """The boot text's ``systemctl enable --now`` calls of gpuinfra units, in order, as argument
    lists."""
    if cloud == "aws":
        calls = yaml.safe_load(text)["runcmd"]
    else:
        calls = [shlex.split(m) for m in re.findall(r"^(?:case .*?\) )?if ! (systemctl [^;]+); then", text, re.M)]
    return [c for c in calls if c[:3] == ["systemctl", "enable", "--now"] and c[-1].startswith("gpuinfra-")]


def _unit_settings(text: str) -> dict[str, list[str]]:
    """Setting name -> values of a unit file (one entry per line)."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("[", "#")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def _exec_argv(value: str) -> list[str]:
    """An ``Exec*=`` value split into words as systemd does for what :func:`systemd_quote`
    writes (single quotes hold no escapes; ``$$`` is ``$``)."""
    return shlex.split(value.replace("$$", "$"))


# ------------------------------------------------------------------ manifest vs rendered text


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_each_unit_and_file_of_the_manifest_is_written_exactly_once(cloud):
    boot, text, _ = _boot_and_text(cloud)
    expected = {f.path: (f.mode, f.content) for f in boot.all_files()}
    written = _written_files(cloud, text)
    counts = Counter(path for path, _, _ in written)
    assert {p for p, n in counts.items() if n > 1} == set()
    assert set(counts) == set(expected)
    for path, mode, content in written:
        assert (mode, content) == expected[path], path
    # every unit the boot writes is a unit file there and is started exactly once
    starts = Counter(call[-1] for call in _starts(cloud, text))
    assert {u.name for u in boot.units} == set(starts) and set(starts.values()) == {1}
    for unit in boot.units:
        assert unit.path in expected and unit.delivery == "boot"


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_the_agent_starts_first_without_blocking_and_scratch_blocks(cloud):
    boot, text, _ = _boot_and_text(cloud)
    starts = _starts(cloud, text)
    assert starts[0][-1] == AGENT_UNIT and "--no-block" in starts[0]
    scratch = next(c for c in starts if c[-1] == SCRATCH_UNIT)
    assert "--no-block" not in scratch
    assert all("--no-block" in c for c in starts if c[-1] != SCRATCH_UNIT)


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_systemd_restarts_the_agent_whatever_its_exit_status_and_never_gives_up(cloud):
    boot, text, bundle = _boot_and_text(cloud)
    files = {path: content for path, _, content in _written_files(cloud, text)}
    agent = _unit_settings(files[next(u.path for u in boot.units if u.name == AGENT_UNIT)])
    # systemd.service(5): Restart=always restarts on a clean exit too; StartLimitIntervalSec=0
    # (systemd.unit(5)) turns the start rate limit off
    assert (agent["Restart"], agent["RestartSec"], agent["StartLimitIntervalSec"]) == (["always"], ["10"], ["0"])
    # stop: SIGTERM to the agent alone (its uploads' CLI children keep running) and time for its
    # bounded sync (100 s on AWS, inside the 2-minute spot notice) before systemd kills it; it
    # stops before the network and /scratch go (systemd.unit(5): stop order is the reverse of After=)
    assert (agent["KillMode"], agent["TimeoutStopSec"]) == (["mixed"], ["115"])
    assert agent["After"] == ["network-online.target scratch.mount"]
    # the job watch the agent imports once the bundle is in sits beside the agent
    assert "/usr/local/lib/gpuinfra/gpuinfra/agent/watch.py" in {f.path for f in bundle.files}


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_node_env_carries_the_gpu_count_verdict_bound_and_the_profiles_hang_settings(cloud):
    from gpuinfra.health.node import ALLREDUCE_TIMEOUT_SECONDS, HEALTH_RESULT_WAIT_SECONDS
    from gpuinfra.profiles import HangSettings

    spec = read_stack_spec(ROOT, EXAMPLES[cloud])
    spec = spec.model_copy(
        update={
            "profile": spec.profile.model_copy(
                update={"hang": HangSettings(action="end", minutes=45, power_percent=15)}
            )
        }
    )
    _, text, _ = _boot_and_text(cloud, spec)
    env = dict(
        line.split("=", 1)
        for line in next(c for p, _, c in _written_files(cloud, text) if p == "/etc/gpuinfra/node.env").splitlines()
    )
    assert int(env["GPUINFRA_HEALTH_WAIT_SECONDS"]) > HEALTH_RESULT_WAIT_SECONDS + 600 + ALLREDUCE_TIMEOUT_SECONDS
    assert {
        k: env[k]
        for k in env
        if k not in ("GPUINFRA_HEALTH_WAIT_SECONDS",)
        and k.startswith(("GPUINFRA_GPU", "GPUINFRA_HANG", "GPUINFRA_PROG"))
    } == {
        "GPUINFRA_GPU_COUNT": "8",
        "GPUINFRA_HANG_ACTION": "end",
        "GPUINFRA_HANG_MINUTES": "45",
        "GPUINFRA_HANG_POWER_PERCENT": "15",
        "GPUINFRA_PROGRESS_FILE": "/scratch/gpuinfra-progress",
    }


@pytest.mark.parametrize(
    ("hang", "field"),
    [
        ({"action": "page"}, "hang.action"),
        ({"minutes": 2}, "hang.minutes"),
        ({"power_percent": 0}, "hang.power_percent"),
    ],
)
def test_a_profile_with_bad_hang_settings_is_refused_naming_the_field(tmp_path, hang, field):
    from gpuinfra.errors import ProfileError
    from gpuinfra.profiles import BUILTIN_PROFILES_FILE, load_profiles

    doc = yaml.safe_load(BUILTIN_PROFILES_FILE.read_text())
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"mine": {**doc["dev"], "hang": hang}}))
    with pytest.raises(ProfileError, match=f"field '{field}'"):
        load_profiles(tmp_path)
    assert {name: p.hang.action for name, p in load_profiles().items()} == {
        "llm-pretrain": "end",
        "llm-finetune": "end",
        "lora-finetune": "end",
        "qlora-finetune": "end",
        "inference": "alert",
        "cv-train": "end",
        "dev": "alert",
    }


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_scratch_is_ordered_before_the_container_runtime(cloud):
    _, text, _ = _boot_and_text(cloud)
    files = {path: content for path, _, content in _written_files(cloud, text)}
    scratch = _unit_settings(files[f"/etc/systemd/system/{SCRATCH_UNIT}"])
    assert "docker.service" in " ".join(scratch["Before"]).split()
    assert scratch["DefaultDependencies"] == ["no"]
    assert ("dlami-nvme.service" in scratch["After"][0].split()) == (cloud == "aws")


@pytest.mark.parametrize(
    "cloud, spec",
    [
        ("aws", lambda: make_spec("g5.xlarge", profile="dev")),  # no EFA: the image is pre-pulled
        ("gcp", lambda: read_stack_spec(ROOT, EXAMPLES["gcp"])),
        ("gcp", lambda: make_spec("a2-highgpu-8g", nodes=2, profile="llm-finetune", cloud="gcp")),
    ],
)
def test_the_health_gate_runs_after_the_pre_pull_on_both_clouds(cloud, spec):
    spec = spec()
    boot, text, bundle = _boot_and_text(cloud, spec)
    assert spec.profile.container_image and PREPULL_UNIT in {u.name for u in boot.units}
    files = {path: content for path, _, content in _written_files(cloud, text)}
    prepull = _unit_settings(files[f"/etc/systemd/system/{PREPULL_UNIT}"])
    assert _exec_argv(prepull["ExecStart"][0]) == ["/usr/bin/docker", "pull", spec.profile.container_image]
    assert SCRATCH_UNIT in prepull["After"][0].split() and "docker.service" in prepull["Requires"][0].split()
    health = _unit_settings(bundle.file(HEALTH_PATH).content)
    assert PREPULL_UNIT in health["After"][0].split()
    # GCP no longer pulls in the background behind the script's back
    assert "docker pull" not in text.replace("/usr/bin/docker pull", "")


def test_aws_efa_nodes_build_their_image_and_the_gate_waits_for_the_build():
    boot, text, bundle = _boot_and_text("aws")
    assert PREPULL_UNIT not in {u.name for u in boot.units}
    assert "gpuinfra-image.service" in _unit_settings(bundle.file(HEALTH_PATH).content)["After"][0].split()


@pytest.mark.tools
def test_cloud_config_passes_the_cloud_init_schema_and_the_gcp_script_passes_shellcheck(tmp_path):
    _, aws_text, _ = _boot_and_text("aws")
    (tmp_path / "user-data").write_text(aws_text)
    result = subprocess.run(
        [need_tool("cloud-init"), "schema", "--config-file", str(tmp_path / "user-data")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    _, gcp_text, _ = _boot_and_text("gcp")
    (tmp_path / "startup.sh").write_text(gcp_text)
    check = subprocess.run(
        [need_tool("shellcheck"), "--severity=style", str(tmp_path / "startup.sh")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout


# -------------------------------------------------------------------------------- injection


@pytest.mark.parametrize("image", EVIL_IMAGES)
def test_a_container_image_that_is_not_an_oci_reference_is_refused_at_spec_validation(image):
    config = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{EXAMPLES['aws']}.yaml").read_text())["config"]
    config["gpuinfra:cluster"]["profile"]["container_image"] = image
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_config(config["gpuinfra:cluster"])
    message = str(caught.value)
    assert "\n" not in message and "profile.container_image" in message
    assert "OCI image reference" in message and "registry/path/name[:tag]" in message
    assert caught.value.exit_code == ExitCode.BAD_INPUT


@pytest.mark.parametrize(
    "image",
    [
        "nvcr.io/nvidia/pytorch:25.01-py3",
        "ubuntu",
        "localhost:5000/a/b_c:1.0",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/train@sha256:" + "a" * 64,
        "us-docker.pkg.dev/p/r/img:v1@sha256:" + "0" * 64,
        "",
    ],
)
def test_oci_references_and_no_image_are_accepted(image):
    config = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{EXAMPLES['aws']}.yaml").read_text())["config"]
    config["gpuinfra:cluster"]["profile"]["container_image"] = image
    assert ClusterSpec.from_config(config["gpuinfra:cluster"]).profile.container_image == image


def test_the_pre_pull_refuses_a_bad_image_even_past_the_spec():
    with pytest.raises(SpecError, match="not an OCI image reference"):
        prepull_unit("nvcr.io/x:1 && touch /tmp/PWNED")


@pytest.mark.parametrize("value", ["a b $(touch /tmp/PWNED) `id` 50%", 'it\'s "quoted"; x', "--privileged"])
def test_a_unit_command_passes_any_value_to_the_program_as_one_argument(value):
    unit = SystemdUnit(
        "x.service",
        "t",
        type="oneshot",
        exec_condition=(shell('! /usr/bin/docker image inspect "$1"', value),),
        exec_start=(command("/usr/bin/docker", "pull", value),),
    )
    settings = _unit_settings(unit.render())
    assert _exec_argv(settings["ExecStart"][0].replace("%%", "%")) == ["/usr/bin/docker", "pull", value]
    condition = _exec_argv(settings["ExecCondition"][0].replace("%%", "%"))
    # the value is an argument of the script ($1), never part of the script's text
    assert condition[:2] == ["/bin/sh", "-c"] and condition[3:] == ["sh", value] and value not in condition[2]


def test_systemd_quoting_escapes_specifiers_variables_and_quotes():
    assert systemd_quote("plain/path:tag") == "plain/path:tag"
    assert systemd_quote("$HOME") == "'$$HOME'"
    assert systemd_quote("$HOME", variables=False) == "'$HOME'"  # Environment=: no variable expansion
    assert systemd_quote("50%") == "50%%"
    assert systemd_quote("a b") == "'a b'"
    assert systemd_quote("it's") == '"it\'s"'
    assert systemd_quote('a\\"b') == '"a\\\\\\"b"'
    with pytest.raises(UnitValueError):
        systemd_quote("a\nb")


def test_the_gcp_writer_quotes_paths_and_never_expands_file_content():
    boot, _, _ = _boot_and_text("gcp")
    evil = NodeFile("/etc/gpuinfra/x.conf", "0644", "$(touch /tmp/PWNED)\nGPUINFRA_EOF\n`id`\n")
    script = startup_script(type(boot)(boot.cloud, boot.summary, (*boot.files, evil), boot.units, boot.steps))
    mode, content = gcp_script_files(script)["/etc/gpuinfra/x.conf"]
    assert content == evil.content and mode == "0644"
    line = next(text for text in script.splitlines() if text.startswith("gpuinfra_file /etc/gpuinfra/x.conf"))
    assert line.endswith("<<'GPUINFRA_EOF_1'")  # a delimiter the content does not hold, quoted


def test_the_aws_writer_cannot_be_given_extra_keys_by_a_value():
    boot, _, _ = _boot_and_text("aws")
    evil = NodeFile("/etc/gpuinfra/x.conf", "0644", "a\nruncmd:\n- [touch, /tmp/PWNED]\n")
    document = yaml.safe_load(
        cloud_config(type(boot)(boot.cloud, boot.summary, (*boot.files, evil), boot.units, boot.steps))
    )
    assert set(document) == {"write_files", "runcmd"}
    assert ["touch", "/tmp/PWNED"] not in document["runcmd"]
    assert {f["path"]: f["content"] for f in document["write_files"]}["/etc/gpuinfra/x.conf"] == evil.content


@pytest.mark.parametrize("bad", ["relative/path", "/etc/a b", "/etc/$(x)", "/etc/a\nb", "/etc/../x"])
def test_node_paths_must_be_absolute_plain_paths(bad):
    with pytest.raises(UnitValueError):
        check_path(bad)


@pytest.mark.parametrize("name", ["x.service; rm", "../x.service", "x.socket", "x.service\n"])
def test_unit_names_are_checked(name):
    with pytest.raises(UnitValueError):
        SystemdUnit(name, "t", exec_start=(command("/bin/true"),))


def test_unit_values_cannot_add_lines():
    with pytest.raises(UnitValueError):
        SystemdUnit("x.service", "t\nExecStartPre=/bin/evil", exec_start=(command("/bin/true"),))
    with pytest.raises(UnitValueError):
        SystemdUnit("x.service", "t", environment=(("A", "1\nB=2"),), exec_start=(command("/bin/true"),))


# --------------------------------------------------------------------- GPUDirect RDMA fact


def test_gpudirect_rdma_is_a_catalog_fact_with_a_source_and_drives_the_nccl_settings():
    p5 = make_spec("p5.48xlarge", nodes=2, profile="llm-pretrain")
    g5 = make_spec("g5.48xlarge", nodes=2, profile="llm-pretrain")
    assert p5.facts.gpudirect_rdma and not g5.facts.gpudirect_rdma
    assert "docs.aws.amazon.com" in p5.facts.sources["gpudirect_rdma"]
    assert "NCCL_SHM_USE_CUDA_MEMCPY" not in nccl_env(plan_aws_cluster(p5), p5.facts)
    assert nccl_env(plan_aws_cluster(g5), g5.facts)["NCCL_SHM_USE_CUDA_MEMCPY"] == "1"
    # the renderer reads the fact, not the name: the same type without the fact gets the setting
    no_rdma = p5.facts.model_copy(update={"gpudirect_rdma": False})
    assert nccl_env(plan_aws_cluster(p5), no_rdma)["NCCL_SHM_USE_CUDA_MEMCPY"] == "1"


def test_facts_recorded_before_the_gpudirect_field_get_it_from_the_same_table():
    spec = read_stack_spec(ROOT, EXAMPLES["aws"])
    data = spec.facts.model_dump(mode="json")
    del data["gpudirect_rdma"]
    assert type(spec.facts).model_validate(data).gpudirect_rdma is True


#: A profile name that YAML (and so cloud-init) would split into lines: U+2028 is a YAML line break.
EVIL_PROFILE_NAME = "llm\u2028bootcmd: [[sh, -c, 'id > /root/pwned']]\u2028#"


def test_a_profile_name_with_a_yaml_line_break_is_refused_when_the_profile_loads():
    profile = read_stack_spec(ROOT, EXAMPLES["aws"]).profile
    with pytest.raises(ValidationError, match="name"):
        type(profile).model_validate({**profile.model_dump(), "name": EVIL_PROFILE_NAME})


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_no_writer_puts_a_line_break_from_a_value_into_the_boot_text(cloud):
    spec = read_stack_spec(ROOT, EXAMPLES[cloud])
    # past validation (model_copy does not validate): the writers refuse it themselves
    evil = spec.model_copy(update={"profile": spec.profile.model_copy(update={"name": EVIL_PROFILE_NAME})})
    with pytest.raises((UnitValueError, ValueError), match="line break"):
        _boot_and_text(cloud, evil)


def test_unit_environment_keeps_dollar_signs_and_free_text_cannot_continue_a_line():
    unit = SystemdUnit(
        "x.service", "50% done", type="oneshot", exec_start=(command("/bin/true"),), environment=(("PRICE", "$5 a b"),)
    )
    settings = _unit_settings(unit.render())
    assert settings["Environment"] == ["'PRICE=$5 a b'"] and settings["Description"] == ["50%% done"]
    with pytest.raises(UnitValueError, match="backslash"):
        SystemdUnit("x.service", "ends in \\", type="oneshot", exec_start=(command("/bin/true"),)).render()


def test_a_stalled_pre_pull_ends_inside_the_peers_result_wait():
    from gpuinfra.health.node import HEALTH_RESULT_WAIT_SECONDS

    settings = _unit_settings(prepull_unit("nvcr.io/nvidia/pytorch:25.01-py3").render())
    assert settings["Type"] == ["oneshot"]  # no start timeout unless one is set
    assert 0 < int(settings["TimeoutStartSec"][0]) < HEALTH_RESULT_WAIT_SECONDS
