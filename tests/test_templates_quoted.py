"""Every ``{{ }}`` of a template that writes node text (shell scripts, the EFA Dockerfile, the udev
rules) goes through a quoting filter of gpuinfra/templating.py, and the filters refuse what
would change a command."""

from __future__ import annotations

import shlex
import subprocess

import jinja2
import pytest
from jinja2 import nodes

from gpuinfra.templating import SHELL_FILTERS, environment, templates_dir

#: Node-text templates; templates/bake/ is left to the bake's own checks.
NODE_TEMPLATES = sorted(
    str(p.relative_to(templates_dir()))
    for p in [*templates_dir().glob("*.sh.j2"), *templates_dir().glob("fabric/*.j2")]
)
#: (template, expression) printed without a filter, and why that is safe: the caller quotes it.
PRE_QUOTED = {
    # gpuinfra/plan/fabric.py render_run_script: each `sh.*` value is shlex.quote-d (or a
    # brace expansion of fixed device names) before rendering
    "gpuinfra-run.sh.j2": "sh",
}


def _unfiltered(template: str, source: str | None = None) -> list[str]:
    """The printed expressions of ``template`` (its file, or ``source``) without a quoting filter."""
    env = environment()
    if source is None:
        source = env.loader.get_source(env, template)[0]  # type: ignore[union-attr]
    tree = env.parse(source)
    bad = []
    for output in tree.find_all(nodes.Output):
        for expr in output.nodes:
            if isinstance(expr, nodes.TemplateData):
                continue
            if isinstance(expr, nodes.Filter) and expr.name in SHELL_FILTERS:
                continue
            if (
                isinstance(expr, nodes.Getattr)
                and isinstance(expr.node, nodes.Name)
                and PRE_QUOTED.get(template) == expr.node.name
            ):
                continue
            bad.append(f"line {expr.lineno}: {type(expr).__name__}")
    return bad


def test_there_are_node_templates():
    assert "gcp-cluster-env.sh.j2" in NODE_TEMPLATES and "fabric/gcp-tcpxo-host.sh.j2" in NODE_TEMPLATES


@pytest.mark.parametrize("template", NODE_TEMPLATES)
def test_every_value_in_a_node_template_goes_through_a_quoting_filter(template):
    assert _unfiltered(template) == []


def test_the_check_finds_an_unfiltered_value():
    assert _unfiltered("x.sh.j2", "echo {{ a }} {{ b | sh }} {{ sh.c }}\n") == ["line 1: Name", "line 1: Getattr"]
    assert _unfiltered("gpuinfra-run.sh.j2", "X={{ sh.image }}\nY={{ other.image }}\n") == ["line 2: Getattr"]


HOSTILE = ["a b", "x;touch /tmp/p", "$(id)", "`id`", "a'b", 'a"b', "a\nb", "a && b", "-rf", ""]


@pytest.mark.parametrize("value", HOSTILE)
def test_sh_makes_any_value_one_word(value):
    text = environment().from_string("printf '<%s>' {{ v | sh }}").render(v=value)
    out = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=30)
    assert out.stdout == f"<{value}>" and out.returncode == 0


@pytest.mark.parametrize("value", [v for v in HOSTILE if v not in ("-rf", "")])
def test_word_refuses_what_needs_quotes(value):
    with pytest.raises(jinja2.TemplateRuntimeError, match="not a plain shell word"):
        environment().from_string('X="{{ v | word }}"').render(v=value)


def test_word_keeps_a_plain_word():
    assert environment().from_string('"{{ v | word }}"').render(v="gs://b-1/x_y.z:1@2") == '"gs://b-1/x_y.z:1@2"'


@pytest.mark.parametrize("value", ["3; id", "3", True, 2.5])
def test_num_takes_integers_only(value):
    with pytest.raises(jinja2.TemplateRuntimeError, match="not an integer"):
        environment().from_string("N={{ v | num }}").render(v=value)
    assert environment().from_string("N={{ v | num }}").render(v=12) == "N=12"


def test_comment_refuses_a_line_break():
    assert environment().from_string("# {{ v | comment }}").render(v="a $(b) 'c'") == "# a $(b) 'c'"
    with pytest.raises(jinja2.TemplateRuntimeError, match="line break"):
        environment().from_string("# {{ v | comment }}").render(v="a\nrm -rf /")


def test_heredoc_refuses_its_delimiter():
    template = environment().from_string("cat <<'END'\n{{ v | heredoc('END') }}\nEND\n")
    assert "$(id)" in template.render(v="$(id)")
    with pytest.raises(jinja2.TemplateRuntimeError, match="END"):
        template.render(v="x\nEND\nid")


def test_a_rendered_cluster_env_quotes_its_values():
    # the real template with a value sh quotes: still one word for bash
    text = (
        environment()
        .get_template("cluster-env-kept.sh.j2")
        .render(kept_ranks_path="/run/a b", node_lib="/x", health_gate="enforce")
    )
    assert f"KEPT_RANKS={shlex.quote('/run/a b')}" in text
