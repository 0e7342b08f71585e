"""jinja2 environment over the project's ``templates/`` folder (StrictUndefined).

In a source checkout the templates are the top-level ``templates/`` folder; an installed wheel
carries them as ``gpuinfra/_templates`` (pyproject.toml force-include). A missing variable is
an error, never an empty string.
"""

from __future__ import annotations

import ast
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
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


#: A shell word that needs no quotes: ``shlex.quote`` leaves exactly these unchanged
#: (docs.python.org/3/library/shlex.html#shlex.quote), and none of them is special to bash inside
#: or outside double quotes (bash(1), "QUOTING": ``$``, backtick, ``\\``, ``"`` and ``!`` are).
PLAIN_WORD_RE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
#: The filters that make a ``{{ }}`` in a shell template safe (tests/test_templates_quoted.py
#: fails on one without): ``sh`` quotes, ``word`` refuses what would need quotes, ``num`` admits
#: numbers only, ``comment`` one line for a ``#`` comment, ``heredoc`` text for a quoted here-document.
SHELL_FILTERS = ("sh", "word", "num", "comment", "heredoc")


def shell_quote(value: object) -> str:
    """Filter ``sh``: ``value`` as one shell word (:func:`shlex.quote`), for a word of its own
    (``cmd {{ x | sh }}``), never inside double quotes.

    Raises:
        jinja2.TemplateRuntimeError: ``value`` is not a string or number.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise jinja2.TemplateRuntimeError(f"sh: {value!r} is not text or a number")
    return shlex.quote(str(value))


def shell_word(value: object) -> str:
    """Filter ``word``: ``value`` unchanged when it is a plain word (:data:`PLAIN_WORD_RE`), so it
    may stand inside double quotes, a comment or a longer word (``"gs://{{ bucket | word }}/x"``).

    The empty string passes (inside double quotes it is an empty value; a word of its own uses
    ``sh``, which writes ``''``).

    Raises:
        jinja2.TemplateRuntimeError: ``value`` holds anything else (space, quote, ``$``, ``;``,
            newline ...).
    """
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not (text == "" or PLAIN_WORD_RE.fullmatch(text)):
        raise jinja2.TemplateRuntimeError(
            f"word: {value!r} is not a plain shell word (letters, digits and _@%+=:,./- only)"
        )
    return text


def shell_number(value: object) -> str:
    """Filter ``num``: an ``int`` (not a bool) as decimal digits.

    Raises:
        jinja2.TemplateRuntimeError: anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise jinja2.TemplateRuntimeError(f"num: {value!r} is not an integer")
    return str(value)


def shell_comment(value: object) -> str:
    """Filter ``comment``: ``value`` as text for a ``#`` comment line: anything printable (a
    comment ends only at the line's end, bash(1) "COMMENTS"), no line break or control character.

    Raises:
        jinja2.TemplateRuntimeError: a line break or other non-printable character.
    """
    text = str(value)
    if not text.isprintable():
        raise jinja2.TemplateRuntimeError(f"comment: {text!r} has a line break or control character")
    return text


def shell_heredoc(value: object, delimiter: str) -> str:
    """Filter ``heredoc(DELIMITER)``: ``value`` as the body of a here-document whose delimiter
    is quoted (``<<'DELIMITER'``: nothing in the body is expanded, bash(1) "Here Documents");
    it ends only at a line that is exactly ``DELIMITER``, so the body may hold no such line.

    Raises:
        jinja2.TemplateRuntimeError: a line of ``value`` is ``delimiter``, or ``value`` has a NUL.
    """
    text = str(value)
    if delimiter in text.splitlines() or "\0" in text:
        raise jinja2.TemplateRuntimeError(f"heredoc: the text has a line {delimiter!r} or a NUL byte")
    return text


def _to_yaml(value: object) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, width=100).rstrip("\n")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The shared environment: StrictUndefined, no autoescape (YAML/shell/cloud-config output),
    ``keep_trailing_newline``, comments written ``{## ... ##}`` (shell needs ``${#a[@]}``),
    a ``to_yaml`` filter (YAML values go through it, never through text indentation) and the
    shell filters of :data:`SHELL_FILTERS` (:func:`shell_quote`, :func:`shell_word`,
    :func:`shell_number`, :func:`shell_comment`, :func:`shell_heredoc`): every ``{{ }}`` in a
    shell template goes through one of them."""
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
    env.filters["sh"] = shell_quote
    env.filters["word"] = shell_word
    env.filters["num"] = shell_number
    env.filters["comment"] = shell_comment
    env.filters["heredoc"] = shell_heredoc
    return env


def render(template: str, **context: object) -> str:
    """Render ``templates/<template>`` with ``context``.

    Raises:
        jinja2.UndefinedError: a variable the template uses was not given.
    """
    return environment().get_template(template).render(**context)


@lru_cache(maxsize=1)
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
    # In this test suite CPython 3.11 raised "SystemError: AST constructor recursion depth
    # mismatch" from ast.parse called deep inside Pulumi's chain of awaits (the user data is
    # rendered in an Output.apply); a thread of its own starts with an empty stack.
    with ThreadPoolExecutor(max_workers=1) as worker:
        return worker.submit(_compact, source).result()


def _compact(source: str) -> str:
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
