"""`gpuinfra new --ssh-cidr` / `--allow-world-ssh` and `gpuinfra preview` of a hand-edited
`network.ssh_cidr`: SSH open to the world is refused (exit 2, one line) unless the stack file
says it was asked for."""

from __future__ import annotations

import yaml

NEW = ("new", "--instance-type", "g5.xlarge", "--profile", "dev", "--name", "g5")


def _cluster(tmp_path) -> dict:
    return yaml.safe_load((tmp_path / "stacks" / "Pulumi.g5.yaml").read_text())["config"]["gpuinfra:cluster"]


def test_new_refuses_world_ssh_and_writes_nothing(run_cli, tmp_path):
    result = run_cli(*NEW, "--ssh-cidr", "0.0.0.0/0", "--project-dir", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --ssh-cidr: network.ssh_cidr 0.0.0.0/0 opens SSH (TCP 22) to the internet")
    assert "--allow-world-ssh" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "stacks" / "Pulumi.g5.yaml").exists()
    for args, message in (
        (("--ssh-cidr", "::/0", "--allow-world-ssh"), "error: --ssh-cidr: not an IPv4 CIDR block: '::/0'"),
        (("--allow-world-ssh",), "error: --allow-world-ssh goes with --ssh-cidr"),
    ):
        bad = run_cli(*NEW, *args, "--project-dir", str(tmp_path))
        assert bad.exit_code == 2 and bad.stderr.startswith(message), bad.stderr
    gcp = run_cli(
        "new", "--gpus", "1xL4", "--cloud", "gcp", "--ssh-cidr", "203.0.113.7/32", "--project-dir", str(tmp_path)
    )
    assert gcp.exit_code == 2 and "AWS settings" in gcp.stderr


def test_new_records_an_allowed_world_ssh_and_preview_accepts_it(run_cli, tmp_path):
    result = run_cli(*NEW, "--ssh-cidr", "0.0.0.0/0", "--allow-world-ssh", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert _cluster(tmp_path)["network"] == {"ssh_cidr": "0.0.0.0/0", "allow_world_ssh": True, "iap_ssh": False}
    assert run_cli("preview", "g5", "--project-dir", str(tmp_path)).exit_code == 0


def test_preview_refuses_a_hand_edited_world_ssh_cidr(run_cli, tmp_path):
    result = run_cli(*NEW, "--ssh-cidr", "203.0.113.7/32", "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert "allow_world_ssh" not in _cluster(tmp_path)["network"]  # not written unless asked for
    path = tmp_path / "stacks" / "Pulumi.g5.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["gpuinfra:cluster"]["network"]["ssh_cidr"] = "0.0.0.0/0"
    path.write_text(yaml.safe_dump(doc))
    refused = run_cli("preview", "g5", "--project-dir", str(tmp_path))
    assert refused.exit_code == 2 and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.startswith("error: gpuinfra:cluster.network: ")
    assert "network.ssh_cidr 0.0.0.0/0 opens SSH (TCP 22) to the internet" in refused.stderr
