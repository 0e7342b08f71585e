"""A warm ``preview`` / ``cost`` (the stack's preview is cached) imports no provider SDK: the
cache entry holds the ``provider-valid-values`` verdict with the resources, and the verdict in
the entry is what ``preview`` enforces."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpuinfra.rules.model import Violation

#: Runs the CLI in a fresh interpreter and reports on stderr which provider SDKs it imported.
_PROBE = (
    "import sys\n"
    "from gpuinfra.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "else:\n"
    "    code = 0\n"
    "sdks = sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('pulumi_aws', 'pulumi_gcp')})\n"
    "print('SDKS=' + ','.join(sdks), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _process(*args: str, **env: str) -> tuple[int, str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    line = next(x for x in done.stderr.splitlines() if x.startswith("SDKS="))
    return done.returncode, done.stdout, [s for s in line.removeprefix("SDKS=").split(",") if s]


def test_warm_preview_and_cost_import_no_provider_sdk_and_print_the_same(run_cli, tmp_path):
    project = str(tmp_path)
    assert run_cli("new", "--gpus", "4xA100", "--cloud", "gcp", "--project-dir", project).exit_code == 0
    cold_code, cold_out, cold_sdks = _process("preview", "gcp-4xa100", "--project-dir", project, GPUINFRA_NO_CACHE="1")
    assert (cold_code, cold_sdks) == (0, ["pulumi_gcp"])  # the program ran: the GCP SDK is needed
    warm_code, warm_out, warm_sdks = _process("preview", "gcp-4xa100", "--project-dir", project)
    assert (warm_code, warm_sdks) == (0, [])
    # the same lines (the tree's order of siblings follows the program's registration order,
    # which varies between runs of the program itself)
    assert sorted(warm_out.splitlines()) == sorted(cold_out.splitlines())
    code, cost_out, sdks = _process("cost", "gcp-4xa100", "--project-dir", project, "--json")
    assert (code, sdks) == (0, [])
    cold_cost = _process("cost", "gcp-4xa100", "--project-dir", project, "--json", GPUINFRA_NO_CACHE="1")[1]
    assert _canonical(json.loads(cost_out)) == _canonical(json.loads(cold_cost))


def _canonical(doc):
    """A JSON document with every list sorted (line order follows the program's registration order)."""
    if isinstance(doc, dict):
        return {k: _canonical(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return sorted((_canonical(v) for v in doc), key=lambda v: json.dumps(v, sort_keys=True))
    return doc


def test_the_cached_verdict_is_enforced(run_cli, tmp_path):
    """A violation recorded in the cache entry refuses the stack (exit 2) without the SDKs; an
    entry without a verdict is recomputed, never read as "no violation"."""
    from gpuinfra import preview as preview_module

    project = str(tmp_path)
    assert run_cli("new", "--gpus", "4xA100", "--cloud", "gcp", "--project-dir", project).exit_code == 0
    (entry,) = preview_module.cache_dir().glob("*.json")
    doc = json.loads(entry.read_text())
    assert doc["provider_violations"] == []
    planted = Violation("provider-valid-values", "gcp-4xa100-nodes", "planted verdict", "test")
    entry.write_text(json.dumps({**doc, "provider_violations": [vars(planted)]}))
    code, out, sdks = _process("preview", "gcp-4xa100", "--project-dir", project)
    assert (code, sdks) == (2, [])
    result = run_cli("preview", "gcp-4xa100", "--project-dir", project)
    assert result.exit_code == 2 and planted.line() in result.stderr

    del doc["provider_violations"]
    entry.write_text(json.dumps(doc))
    code, out, sdks = _process("preview", "gcp-4xa100", "--project-dir", project)
    assert (code, sdks) == (0, ["pulumi_gcp"])  # recomputed: the program and the check ran
    assert json.loads(entry.read_text())["provider_violations"] == []
