"""The docs: generated reference pages match the code, every CLI option is in the CLI reference,
the site builds with ``mkdocs build --strict``, every relative link of README.md and docs/ leads
to a file (and heading) that exists, and the README stays short."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_reference_pages_are_up_to_date():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_the_check_names_a_stale_page(tmp_path, monkeypatch):
    gen = _script("gen_docs")
    monkeypatch.setattr(gen, "REFERENCE", tmp_path / "reference")
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main([]) == 0
    page = tmp_path / "reference" / "exit-codes.md"
    page.write_text(page.read_text().replace("| 8 |", "| 9 |"))
    assert gen.main(["--check"]) == 1


def test_every_cli_option_is_in_the_cli_reference():
    gen = _script("gen_docs")
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    sections = {m.group(1): m.end() for m in re.finditer(r"^## `([^`]+)`$", page, re.MULTILINE)}
    options = gen.cli_options()
    assert len(options) > 100  # every command, not a vacuous walk
    missing = []
    for path, option in options:
        start = sections.get(path)
        end = min([at for at in sections.values() if start is not None and at > start], default=len(page))
        if start is None or f"`{option}`" not in page[start:end]:
            missing.append(f"{path} {option}")
    assert not missing, missing


def test_user_file_bounds_come_from_the_code():
    from gpuinfra import userfile

    page = (ROOT / "docs" / "reference" / "user-files.md").read_text()
    assert f"{userfile.MAX_DEPTH} levels" in page and f"{userfile.MAX_NODES:,}" in page
    assert f"{userfile.MAX_FILE_BYTES:,} bytes" in page


def test_mkdocs_build_strict(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _anchors(path: Path) -> set[str]:
    slug = _script("mkdocs_hooks").github_slug
    text = _FENCE.sub("", path.read_text())
    return {slug(re.sub(r"[`*]", "", m.group(1))) for m in re.finditer(r"^#{1,6} (.+?)\s*$", text, re.MULTILINE)}


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_existing_files_and_headings(doc):
    broken = []
    for target in _LINK.findall(_FENCE.sub("", doc.read_text())):
        if re.match(r"^[a-z]+:", target) or target.startswith("#") and doc.name != "README.md":
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists() or anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(target)
    assert not broken, broken


#: The README's two quick-start commands, as CI runs them (.ci/run greps the test command).
QUICK_START = ("scripts/uv run gpuinfra new --gpus 4xA100", "scripts/uv run --extra test pytest")


def test_readme_is_short_and_keeps_the_quick_start(run_cli, tmp_path):
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 15 * 1024
    lines = readme.splitlines()
    assert all(command in lines for command in QUICK_START)
    # the main job it names runs offline and writes the stack the next steps use
    result = run_cli(*QUICK_START[0].split()[3:], "--project-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "stacks" / "Pulumi.gcp-4xa100.yaml").is_file()
    assert "scripts/uv run gpuinfra preview gcp-4xa100" in readme
