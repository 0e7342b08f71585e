"""The import contract of ``gpuinfra/`` and ``blueprints/``.

* The layers ``cli > services > blueprints > plan > domain > data`` (import-linter, configured in
  ``pyproject.toml`` ``[tool.importlinter]``, which lists the modules of each layer and why):
  a module imports only its own layer and the ones below, function-local imports included.
* No import cycle through module-level imports, between modules or between packages
  (``gpuinfra.<package>``) (Tarjan's strongly connected components over the AST of every module).
* A function-local import of a ``gpuinfra`` / ``blueprints`` module says why it is not at the
  top, in a comment on its line or on the line above its block of imports (a heavy optional
  dependency such as Pulumi or a provider SDK, or the CLI's start-up time).
* The node-side modules (:data:`gpuinfra.plan.node_bundle.NODE_MODULES`, shipped to the nodes)
  import only the standard library and each other.

The counts go to the closing summary (:data:`tests.conftest.SUMMARY_LINES`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuinfra.plan.node_bundle import NODE_MODULES
from tests.conftest import SUMMARY_LINES

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gpuinfra", "blueprints")
#: Function-local imports that stay without a comment, each with its reason.
UNCOMMENTED_LOCAL_IMPORTS = {
    # Both files ship byte for byte in the node bundle, whose hashes tests/golden pins; the
    # comment comes with the next intended change of the node modules.
    ("gpuinfra.health.node", "gpuinfra.agent.node"),
}


@dataclass(frozen=True)
class Import:
    """One import statement of an internal module.

    Attributes:
        source: the importing module (dotted name); target: the imported module.
        line: 1-based line of the statement; local: inside a function (or lambda).
        commented: a comment on its line or on the line above its block of imports.
    """

    source: str
    target: str
    line: int
    local: bool
    commented: bool


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module under :data:`PACKAGES` (packages by their ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` denotes: itself, else its longest enclosing module (``a.b.func`` -> ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """Internal modules one import statement loads (``from pkg import mod`` counts ``pkg.mod``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    return {t for t in (_resolve(n, modules) for n in names) if t and t != module}


def _import_statements(node: ast.AST, local: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``node``, in source order, with whether it sits inside a
    function (``local``)."""
    for child in ast.iter_child_nodes(node):
        inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, local
        yield from _import_statements(child, inner)


def collect_imports() -> tuple[dict[str, Path], list[Import]]:
    """Every module and every import of an internal module in them, from the AST."""
    modules = _modules()
    imports: list[Import] = []
    for module, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        statements = list(_import_statements(tree, False))
        import_lines = {
            line for node, _ in statements for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
        }
        for node, local in statements:
            above = node.lineno - 1
            while above in import_lines:
                above -= 1
            commented = "#" in lines[node.lineno - 1] or (above >= 1 and lines[above - 1].lstrip().startswith("#"))
            for target in _targets(node, module, path.name == "__init__.py", modules):
                imports.append(Import(module, target, node.lineno, local, commented))
    return modules, imports


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` with more than one member (cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(vertex: str) -> None:
        index[vertex] = low[vertex] = len(index)
        stack.append(vertex)
        on_stack.add(vertex)
        for successor in sorted(graph.get(vertex, ())):
            if successor not in index:
                connect(successor)
                low[vertex] = min(low[vertex], low[successor])
            elif successor in on_stack:
                low[vertex] = min(low[vertex], index[successor])
        if low[vertex] == index[vertex]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == vertex:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for vertex in sorted(graph):
        if vertex not in index:
            connect(vertex)
    return components


def _graph(imports: list[Import], with_local: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if with_local or not imp.local:
            graph.setdefault(imp.source, set()).add(imp.target)
    return graph


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` between packages (``gpuinfra.cost.estimate`` -> ``gpuinfra.cost``), self-edges dropped."""

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packaged: dict[str, set[str]] = {}
    for source, targets in graph.items():
        packaged.setdefault(package(source), set()).update(package(t) for t in targets if package(t) != package(source))
    return packaged


def test_layers_contract_is_kept():
    # import-linter's own command line (it configures its option readers and prints the broken imports)
    command = [
        sys.executable,
        "-c",
        "from importlinter.cli import lint_imports_command; lint_imports_command()",
        "--config",
        str(ROOT / "pyproject.toml"),
        "--no-cache",
        "--no-logo",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout, result.stdout


#: Package ``__init__`` modules whose modules sit in different layers (so the package itself
#: cannot be named in one): each only re-exports its own modules' names.
SPLIT_PACKAGES = {
    "gpuinfra",
    "gpuinfra.bake",
    "gpuinfra.catalog",
    "gpuinfra.cost",
    "gpuinfra.health",
    "gpuinfra.monitoring",
    "gpuinfra.rules",
    "gpuinfra.sizing",
}


def test_every_module_is_in_a_layer():
    """A module in no layer has its imports checked by nothing: each is named, or lies under a
    named package, in the layers contract of pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    named = {name.strip() for layer in layers for name in layer.split(":")}
    modules, _ = collect_imports()
    unassigned = sorted(
        m for m in modules if m not in SPLIT_PACKAGES and not any(m == n or m.startswith(n + ".") for n in named)
    )
    assert unassigned == []


def test_no_module_level_import_cycle():
    modules, imports = collect_imports()
    module_level = strongly_connected(_graph(imports, with_local=False))
    with_local = strongly_connected(_graph(imports, with_local=True))
    local_count = sum(1 for imp in imports if imp.local)
    packages = strongly_connected(_package_graph(_graph(imports, with_local=False)))
    SUMMARY_LINES.append(
        f"import graph: {len(modules)} modules, {len(imports)} internal imports ({local_count} function-local); "
        f"cycles: {len(module_level)} through module-level imports, {len(with_local)} with function-local ones, "
        f"{len(packages)} between packages (gpuinfra.<package>) through module-level imports"
    )
    assert module_level == [], f"module-level import cycles: {module_level}"
    assert packages == [], f"module-level import cycles between packages: {packages}"


def test_function_local_imports_say_why():
    _, imports = collect_imports()
    silent = sorted(
        {
            (imp.source, imp.line, imp.target)
            for imp in imports
            if imp.local and not imp.commented and (imp.source, imp.target) not in UNCOMMENTED_LOCAL_IMPORTS
        }
    )
    assert silent == [], (
        "function-local imports without a comment saying why (move them to the top, or say "
        f"which heavy dependency or start-up cost they avoid): {silent}"
    )


def test_node_modules_import_only_each_other():
    node_modules = {
        "gpuinfra." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for rel in NODE_MODULES
    } | {"gpuinfra"}
    _, imports = collect_imports()
    outside = sorted(
        {(imp.source, imp.target) for imp in imports if imp.source in node_modules and imp.target not in node_modules}
    )
    assert outside == [], f"node-side modules import modules the node bundle does not ship: {outside}"
