"""jinja2 environment over the project's ``templates/`` folder (StrictUndefined).

In a source checkout the templates are the top-level ``templates/`` folder; an installed wheel
carries them as ``gpuinfra/_templates`` (pyproject.toml force-include). A missing variable is
an error, never an empty string.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import jinja2
import yaml


def templates_dir() -> Path:
    """Folder holding the ``*.j2`` templates."""
    packaged = Path(__file__).parent / "_templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "templates"


def _to_yaml(value: object) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, width=100).rstrip("\n")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The shared environment: StrictUndefined, no autoescape (YAML/shell/cloud-config output),
    ``keep_trailing_newline``, comments written ``{## ... ##}`` (shell needs ``${#a[@]}``),
    and a ``to_yaml`` filter."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        # shell uses "{#" in ${#array[@]}: make jinja comments "{##" ... "##}" instead
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters["to_yaml"] = _to_yaml
    return env


def render(template: str, **context: object) -> str:
    """Render ``templates/<template>`` with ``context``.

    Raises:
        jinja2.UndefinedError: a variable the template uses was not given.
    """
    return environment().get_template(template).render(**context)


def agent_source() -> str:
    """Source of the standalone node agent (``gpuinfra/agent/node.py``) that the user data
    writes to ``/usr/local/lib/gpuinfra/gpuinfra_agent.py``, without its docstrings and
    comments (:func:`compact_source`): EC2 takes 16 KB of user data
    (docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html) and the agent is its largest part."""
    return compact_source((Path(__file__).parent / "agent" / "node.py").read_text())


def compact_source(source: str) -> str:
    """``source`` re-printed by :func:`ast.unparse` with every docstring removed: the same
    program (the AST is unchanged apart from the docstrings), without comments or docstrings.

    Raises:
        SyntaxError: ``source`` is not valid Python.
    """
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)
