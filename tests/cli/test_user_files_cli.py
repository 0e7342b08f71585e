"""Every file a user writes or edits (stack, profiles, usage and preview files) goes through one
reader: a broken or hostile file is one `error:` line naming the file and the problem, exit 2,
and `ls` / `image ls` list an unreadable stack file as INVALID instead of crashing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from gpuinfra.errors import SpecError
from gpuinfra.userfile import MAX_DEPTH, MAX_NODES, read_user_file


def _refused(result, *parts: str) -> None:
    """Exit 2, exactly one line on stderr, ``error: `` first, every part in it (no internal error)."""
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr


@pytest.fixture
def project(run_cli, tmp_path):
    """A project with one good stack ``t1`` (GCP 4xA100)."""
    assert run_cli("new", "--gpus", "4xA100", "--name", "t1", "--project-dir", str(tmp_path)).exit_code == 0
    return tmp_path


def _stack_text(project: Path) -> str:
    return (project / "stacks" / "Pulumi.t1.yaml").read_text()


# what each broken stack file holds, and the words the refusal must carry
BROKEN_STACK_FILES = {
    "binary": (bytes(range(256)) * 20, "binary file"),
    "not-utf8": ("config:\n  x: caf\xe9\n".encode("latin-1"), "is not UTF-8 text"),
    "top-list": (b"- config\n- 2\n", "the top level must be a mapping, not list"),
    "config-list": (b"config:\n- 1\n- 2\n", "'config' must be a mapping"),
    "cluster-string": (b"config:\n  gpuinfra:cluster: hello\n", "gpuinfra:cluster must be a mapping"),
    "deep": (b"config: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", f"nests deeper than {MAX_DEPTH} levels"),
    "laughs": (
        b'config:\n  a: &a ["x","x","x","x","x","x","x","x","x","x"]\n'
        + b"".join(
            f"  {chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 10)}]\n".encode() for i in range(7)
        ),
        f"expands to more than {MAX_NODES} values",
    ),
    "empty": (b"# nothing but a comment\n", "the top level must be a mapping, not empty document"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_STACK_FILES))
def test_a_broken_stack_file_is_refused_by_preview_and_cost_and_listed_invalid(run_cli, project, case):
    content, words = BROKEN_STACK_FILES[case]
    (project / "stacks" / f"Pulumi.{case}.yaml").write_bytes(content)
    for command in ("preview", "cost", "status"):
        result = run_cli(command, case, "--project-dir", str(project))
        _refused(result, f"Pulumi.{case}.yaml", words)
    listing = run_cli("ls", "--project-dir", str(project), "--json")
    assert listing.exit_code == 0, listing.stderr
    rows = {row["stack"]: row for row in json.loads(listing.stdout)}
    assert rows["t1"]["invalid"] is None and words in rows[case]["invalid"]
    human = run_cli("ls", "--project-dir", str(project))
    assert human.exit_code == 0 and case in human.stdout and "INVALID" in human.stdout
    images = run_cli("image", "ls", "--project-dir", str(project), "--json")
    assert images.exit_code == 0, images.stderr
    # a file that cannot be read as a stack file could be a bake: `image ls` shows it too; one
    # that is recognisably a cluster stack (gpuinfra:cluster present) is `ls`'s alone
    expected = [] if case == "cluster-string" else [(case, True)]
    assert [(row["name"], words in row["invalid"]) for row in json.loads(images.stdout)] == expected


def test_a_key_given_twice_is_refused_not_silently_the_last(run_cli, project):
    text = _stack_text(project)
    assert "    nodes: 1\n" in text
    (project / "stacks" / "Pulumi.t1.yaml").write_text(text.replace("    nodes: 1\n", "    nodes: 1\n    nodes: 3\n"))
    result = run_cli("preview", "t1", "--project-dir", str(project))
    _refused(result, "Pulumi.t1.yaml", "key 'nodes' appears twice in one mapping")


def test_a_stack_file_that_is_a_symlink_out_of_the_project(run_cli, project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "passwd"
    outside.write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.symlink(outside, project / "stacks" / "Pulumi.y-symlink.yaml")
    _refused(run_cli("preview", "y-symlink", "--project-dir", str(project)), "is a symlink to", "outside")
    rows = {r["stack"]: r for r in json.loads(run_cli("ls", "--project-dir", str(project), "--json").stdout)}
    assert "is a symlink to" in rows["y-symlink"]["invalid"]


def test_a_symlink_inside_the_project_is_read(run_cli, project):
    (project / "stacks" / "Pulumi.t1.yaml").rename(project / "t1.yaml")
    os.symlink(project / "t1.yaml", project / "stacks" / "Pulumi.t1.yaml")
    assert run_cli("cost", "t1", "--project-dir", str(project)).exit_code == 0


@pytest.mark.parametrize("command", ["preview", "cost", "status", "check"])
def test_a_stack_name_pulumi_does_not_allow_is_refused_before_any_file_is_opened(run_cli, project, command):
    # 300 characters: the file name would be too long for the file system (ENAMETOOLONG)
    _refused(run_cli(command, "x" * 300, "--project-dir", str(project)), "use 1-100 letters, digits")


def test_a_stack_path_that_is_a_folder_is_not_called_missing(run_cli, project):
    (project / "stacks" / "Pulumi.y-isdir.yaml").mkdir()
    _refused(run_cli("preview", "y-isdir", "--project-dir", str(project)), "is a folder, not a file")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("internet_egress_gb: .nan\n", "'.nan' is not a finite number"),
        ("internet_egress_gb: .inf\n", "'.inf' is not a finite number"),
        ("bucket_storage_gb: 1.0e+30\n", "must be from 0 to 1,000,000,000"),
        ("bucket_storage_gb: -1\n", "must be from 0 to 1,000,000,000"),
        ("bucket_storage_gb: 1e30\n", "must be a number, got '1e30'"),  # YAML 1.1 reads 1e30 as text
        ("bucket_storage_gb: true\n", "must be a number, got True"),
        ("bucket_storage_gb: '12'\n", "must be a number, got '12'"),
        ("- 1\n", "the top level must be a mapping, not list"),
    ],
)
def test_a_usage_file_with_a_value_that_is_not_a_quantity(run_cli, project, tmp_path_factory, content, words):
    usage = tmp_path_factory.mktemp("usage") / "u.yaml"
    usage.write_text(content)
    _refused(run_cli("cost", "t1", "--usage", str(usage), "--project-dir", str(project)), words)


def test_a_binary_usage_file(run_cli, project, tmp_path_factory):
    usage = tmp_path_factory.mktemp("usage") / "u.yaml"
    usage.write_bytes(b"\xa5\x86" * 1000)
    _refused(run_cli("cost", "t1", "--usage", str(usage), "--project-dir", str(project)), "usage file", "not UTF-8")


def test_an_empty_usage_file_keeps_the_profile_defaults(run_cli, project, tmp_path_factory):
    usage = tmp_path_factory.mktemp("usage") / "u.yaml"
    usage.write_text("# no overrides\n")
    plain = run_cli("cost", "t1", "--project-dir", str(project), "--json")
    empty = run_cli("cost", "t1", "--usage", str(usage), "--project-dir", str(project), "--json")
    assert empty.exit_code == 0 and json.loads(empty.stdout)["lines"] == json.loads(plain.stdout)["lines"]


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"steps": [1, 2, 3]}, "step 1 must be an object"),
        ({"steps": [{"urn": 5}]}, "step 1: 'urn' and 'type' must be strings"),
        ({"steps": [{"newState": {"type": "aws:s3/bucket:Bucket", "inputs": [1]}}]}, "'inputs' an object"),
        ({"steps": [], "config": [1]}, "'config' must be an object"),
    ],
)
def test_a_malformed_preview_file(run_cli, project, tmp_path_factory, doc, words):
    path = tmp_path_factory.mktemp("preview") / "plan.json"
    path.write_text(json.dumps(doc))
    _refused(run_cli("cost", "t1", "--from-preview", str(path), "--project-dir", str(project)), words)


def test_a_preview_file_with_nan_or_a_repeated_key(run_cli, project, tmp_path_factory):
    folder = tmp_path_factory.mktemp("preview")
    (folder / "nan.json").write_text('{"steps": [], "x": NaN}')
    (folder / "dup.json").write_text('{"steps": [], "steps": []}')
    _refused(run_cli("cost", "t1", "--from-preview", str(folder / "nan.json"), "--project-dir", str(project)), "NaN")
    _refused(
        run_cli("cost", "t1", "--from-preview", str(folder / "dup.json"), "--project-dir", str(project)),
        "key 'steps' appears twice",
    )


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (bytes(range(256)), "binary file"),
        (b"mine: {name: other, description: x}\n", "'name' is not a setting (a profile's name is its key"),
        (b"mine: {1: x}\n", "1 is not a setting"),
        (b"1: {description: x}\n", "profile name 1 must be a string"),
        (b"mine: {description: x}\nmine: {description: y}\n", "key 'mine' appears twice"),
    ],
)
def test_a_broken_profiles_file(run_cli, tmp_path, content, words):
    (tmp_path / "p.yaml").write_bytes(content)
    _refused(run_cli("profiles", "--profiles-dir", str(tmp_path)), words)


def test_the_reader_refuses_oversized_files_before_reading_them(tmp_path, monkeypatch):
    import gpuinfra.userfile as userfile

    path = tmp_path / "big.yaml"
    path.write_text("a: 1\n" * 10)
    monkeypatch.setattr(userfile, "MAX_FILE_BYTES", 20)
    with pytest.raises(SpecError, match="is 50 bytes; at most 20 are read"):
        read_user_file(path, kind="stack file", error=SpecError)


def test_gpuinfras_own_stack_file_reads_back_unchanged(project):
    """The strict reader takes every stack file `new` writes: same values as a plain YAML load."""
    path = project / "stacks" / "Pulumi.t1.yaml"
    assert read_user_file(path, kind="stack file", error=SpecError, root=project) == yaml.safe_load(path.read_text())


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("bucket_storage_gb: 5\nnote: 2026-13-45\n", "holds a value YAML cannot build: month must be in 1..12"),
        ("bucket_storage_gb: !!int abc\n", "holds a value YAML cannot build"),
        ("bucket_storage_gb: !!set [1]\n", "holds a value YAML cannot build"),
        ("bucket_storage_gb: " + "9" * 5000 + "\n", "holds a value YAML cannot build"),
        ('note: "\\ud800"\n', "lone surrogate"),
    ],
)
def test_values_yaml_cannot_build_are_one_line(run_cli, project, tmp_path_factory, content, words):
    usage = tmp_path_factory.mktemp("usage") / "u.yaml"
    usage.write_text(content)
    _refused(run_cli("cost", "t1", "--usage", str(usage), "--project-dir", str(project)), "usage file", words)
    # the same line in a stack file: ls lists it as INVALID, preview refuses it
    (project / "stacks" / "Pulumi.odd.yaml").write_text("config:\n  " + content.replace("\n", "\n  "))
    _refused(run_cli("preview", "odd", "--project-dir", str(project)), words)
    rows = {r["stack"]: r for r in json.loads(run_cli("ls", "--project-dir", str(project), "--json").stdout)}
    assert words.split(":")[0] in rows["odd"]["invalid"]


def test_yaml_merge_keys_are_yaml(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n")
    assert read_user_file(path, kind="f", error=SpecError)["d"] == {"x": 1, "y": 3}


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ('{"steps": [], "x": 1e999}', "1e999 is not a finite number"),
        ('{"steps": [{"newState": {"type": "a", "urn": "u", "inputs": {"n": "\\ud800"}}}]}', "lone surrogate"),
    ],
)
def test_a_preview_file_with_a_non_finite_number_or_a_non_character(run_cli, project, tmp_path_factory, doc, words):
    path = tmp_path_factory.mktemp("preview") / "plan.json"
    path.write_text(doc)
    _refused(run_cli("cost", "t1", "--from-preview", str(path), "--project-dir", str(project)), words)


def _fleet_preview(target) -> str:
    step = {
        "op": "create",
        "urn": "urn:pulumi:s::gpuinfra::aws:ec2/fleet:Fleet::s-fleet",
        "newState": {"type": "aws:ec2/fleet:Fleet", "urn": "urn:pulumi:s::gpuinfra::aws:ec2/fleet:Fleet::s-fleet",
                     "inputs": {"targetCapacitySpecification": target}},
    }  # fmt: skip
    return json.dumps({"config": {"aws:region": "us-east-1"}, "steps": [step]})


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ({"totalTargetCapacity": -2, "defaultTargetCapacityType": "on-demand"}, "has a negative quantity"),
        (None, "a resource input has a shape `pulumi preview --json` does not write"),
        ([1, 2], "a resource input has a shape"),
        ({"totalTargetCapacity": "two"}, "a resource input has a shape"),
    ],
)
def test_a_preview_file_with_inputs_of_the_wrong_shape_or_sign(run_cli, project, tmp_path_factory, target, words):
    path = tmp_path_factory.mktemp("preview") / "plan.json"
    path.write_text(_fleet_preview(target))
    result = run_cli("cost", "t1", "--from-preview", str(path), "--project-dir", str(project), "--budget", "1")
    _refused(result, "preview file", words)
