"""mkdocs hooks (mkdocs.yml ``hooks:``): heading anchors as GitHub makes them, so one link
(``README.md#exit-codes``, ``cluster-facts.md#23-nic--vpc-layout-...``) works on GitHub and on
the site alike. Python-Markdown's own slugify folds runs of ``-`` into one; GitHub does not."""

from __future__ import annotations

import re


def github_slug(value: str, separator: str = "-") -> str:
    """GitHub's heading anchor: lower case, punctuation other than ``-`` and ``_`` dropped,
    each space a ``-`` (runs are kept: "A & B" -> ``a--b``)."""
    return re.sub(r"[^\w\- ]", "", value.strip().lower()).replace(" ", separator)


def on_config(config, **kwargs):
    """Use :func:`github_slug` for every page's heading ids."""
    if "toc" not in config["markdown_extensions"]:
        config["markdown_extensions"].append("toc")
    config["mdx_configs"].setdefault("toc", {})["slugify"] = github_slug
    return config
