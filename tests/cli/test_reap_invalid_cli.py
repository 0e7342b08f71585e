"""`ls` and `reap` show stack files they cannot read instead of hiding them; `reap` goes on after a
failed destroy and reports every result. The Automation API is replaced at
its boundary (:class:`gpuinfra.lifecycle.Backend`) by a recording fake."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from gpuinfra import lifecycle
from gpuinfra.errors import OperationError
from gpuinfra.lifecycle import StackStatus


class FailingBackend:
    """Every stack deployed 2 h ago; ``destroy`` of a stack in ``fail`` raises its error."""

    def __init__(self, deployed, fail=None):
        self.deployed = set(deployed)
        self.fail = fail or {}
        self.calls = []

    def list_stacks(self, project_dir):
        return [StackStatus(n, False, datetime.now(UTC) - timedelta(hours=2), 30) for n in sorted(self.deployed)]

    def outputs(self, project_dir, stack):
        return {}  # no nodes, no bucket: nothing to ask to sync

    def destroy(self, project_dir, stack, on_event):
        self.calls.append(("destroy", stack))
        if stack in self.fail:
            raise self.fail[stack]
        self.deployed.discard(stack)
        return {"delete": 30}


@pytest.fixture
def project(run_cli, tmp_path, monkeypatch):
    """Three expired AWS stacks a, b, c (dev profile, TTL 12 h) in one project."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    for name in ("a", "b", "c"):
        assert (
            run_cli(
                "new",
                "--instance-type",
                "g5.xlarge",
                "--profile",
                "dev",
                "--name",
                name,
                "--project-dir",
                str(tmp_path),
            ).exit_code
            == 0
        )
        _edit(tmp_path, name, lambda c: c.update(created_at="2026-01-01T00:00:00Z"))
    return tmp_path


def _edit(project: Path, name: str, change) -> None:
    path = project / "stacks" / f"Pulumi.{name}.yaml"
    doc = yaml.safe_load(path.read_text())
    change(doc["config"]["gpuinfra:cluster"])
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _use(monkeypatch, backend) -> None:
    monkeypatch.setattr(lifecycle, "make_backend", lambda: backend)


def test_reap_goes_on_after_a_failed_destroy_and_exits_7(run_cli, project, monkeypatch):
    backend = FailingBackend(
        {"a", "b", "c"}, fail={"b": OperationError("pulumi failed on stack 'b': DependencyViolation")}
    )
    _use(monkeypatch, backend)
    result = run_cli("reap", "--expired", "--project-dir", str(project))
    assert result.exit_code == 7
    assert backend.calls == [("destroy", "a"), ("destroy", "b"), ("destroy", "c")]  # c still destroyed after b failed
    assert "destroyed a\nFAILED b: pulumi failed on stack 'b': DependencyViolation\ndestroyed c\n" in result.stdout
    assert result.stderr == (
        "error: 1 of 3 expired stacks were not destroyed: b (pulumi failed on stack 'b': DependencyViolation)\n"
    )


def test_reap_lists_an_unreadable_stack_file_and_exits_2_after_the_others(run_cli, project, monkeypatch):
    _edit(project, "b", lambda c: c["price"].update(on_demand_price_per_hour_usd="abc"))
    backend = FailingBackend({"a", "b", "c"})
    _use(monkeypatch, backend)
    result = run_cli("reap", "--expired", "--project-dir", str(project))
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert backend.calls == [("destroy", "a"), ("destroy", "c")]
    assert (
        "INVALID b: not checked (gpuinfra:cluster.price.on_demand_price_per_hour_usd: not a price: 'abc'"
        in result.stdout
    )
    assert result.stderr.startswith(
        "error: 1 stack file(s) could not be read, so their expiry is unknown: b "
        "(gpuinfra:cluster.price.on_demand_price_per_hour_usd: not a price: 'abc'"
    )


def test_reap_dry_run_names_the_unreadable_stack_too(run_cli, project, monkeypatch):
    _edit(project, "c", lambda c: c.update(stack="z"))
    backend = FailingBackend({"a", "b", "c"})
    _use(monkeypatch, backend)
    result = run_cli("reap", "--expired", "--dry-run", "--project-dir", str(project))
    assert result.exit_code == 2 and backend.calls == []
    assert "would destroy a" in result.stdout and "would destroy b" in result.stdout
    assert "INVALID c: not checked" in result.stdout and "holds stack 'z', not 'c'" in result.stderr


def test_ls_shows_an_invalid_stack_with_its_reason(run_cli, project, monkeypatch):
    _edit(project, "a", lambda c: c.update(nodes="many"))
    _use(monkeypatch, FailingBackend({"b"}))
    table = run_cli("ls", "--project-dir", str(project))
    assert table.exit_code == 0 and table.stderr == ""
    assert "3 stacks (1 invalid)" in table.stdout
    assert "INVALID a: gpuinfra:cluster.nodes: Input should be a valid integer" in table.stdout
    rows = {r["stack"]: r for r in json.loads(run_cli("ls", "--json", "--project-dir", str(project)).stdout)}
    assert set(rows) == {"a", "b", "c"} and rows["b"]["deployed"] is True and rows["b"]["invalid"] is None
    assert rows["a"]["invalid"].startswith("gpuinfra:cluster.nodes: Input should be a valid integer")
    assert rows["a"]["deployed"] is None and rows["a"]["expires_at"] is None
