"""The one reader of files a user writes or edits: stack files, profiles files, usage files and
`pulumi preview --json` files.

Every such file goes through :func:`read_user_file`, which refuses, with one line naming the file
and the problem, what would otherwise crash a command or be read wrongly:

* a path that is missing, a folder, not a regular file, or (with ``root``) a symlink that leads
  out of the project folder;
* a file over ``MAX_FILE_BYTES``, not UTF-8 text (binary content, NUL bytes);
* YAML or JSON that does not parse, that repeats a key in one mapping (the Pulumi CLI's YAML
  parser refuses duplicate keys too, so gpuinfra must not quietly take the last one), nests
  deeper than ``MAX_DEPTH``, or whose anchors and aliases expand to more than ``MAX_NODES`` nodes
  (the "billion laughs" shape: https://en.wikipedia.org/wiki/Billion_laughs_attack);
* a number that is not finite (``.nan``, ``.inf``, JSON ``NaN``/``Infinity``): no setting of
  gpuinfra is NaN or infinite, and Decimal arithmetic on one raises later;
* a top level of the wrong shape (a list where a mapping belongs).

Depth and expansion are measured on the parser's event stream before any object is built, so a
hostile file costs time linear in its size (PyYAML's parser is iterative; its composer recurses
once per level, which is why depth is checked first). The caller passes the error class to raise,
so each kind of file keeps its documented exit code (:mod:`gpuinfra.errors`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from gpuinfra.errors import GpuinfraError

#: Largest user file read, in bytes. gpuinfra's own stack files are about 10-30 KB and a
#: `pulumi preview --json` of the largest stack about 2 MB; 16 MiB leaves room and bounds memory.
MAX_FILE_BYTES = 16 * 1024 * 1024
#: Deepest nesting of mappings and lists accepted (gpuinfra's own files nest at most 7 deep).
MAX_DEPTH = 64
#: Most nodes (scalars, mappings, lists) a document may expand to, counting every alias as a copy
#: of what its anchor names.
MAX_NODES = 1_000_000
_SURROGATE = re.compile("[\ud800-\udfff]")


def read_user_file(
    path: Path,
    *,
    kind: str,
    error: type[GpuinfraError],
    fmt: str = "yaml",
    root: Path | None = None,
    top: type = dict,
    empty: Any = None,
) -> Any:
    """Read and parse one user file, refusing anything gpuinfra cannot use safely.

    Args:
        path: the file.
        kind: what the file is, for messages ("stack file", "usage file", ...).
        error: the :class:`GpuinfraError` subclass to raise (its exit code is the command's).
        fmt: "yaml" or "json".
        root: when given, the resolved path must lie inside this folder (a symlink out of the
            project is refused).
        top: the type the top level must have (``dict`` for every file gpuinfra reads).
        empty: returned for an empty document (no content, or only comments); None refuses it
            as the wrong shape.

    Returns:
        The parsed document (plain dicts, lists, str, int, float, bool, None, dates).

    Raises:
        ``error``: one line ``<kind> <path>: <problem>`` for each case in the module docstring.
    """
    where = f"{kind} {path}"
    text = _read_text(Path(path), where, error, root)
    try:
        doc = _parse_json(text) if fmt == "json" else _parse_yaml(text)
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    if doc is None and empty is not None:
        return empty
    if not isinstance(doc, top):
        raise error(f"{where}: the top level must be a {_shape(top)}, not {_shape(type(doc))}")
    return doc


class _Refused(Exception):
    """A parse problem, worded for the user (wrapped into the caller's error class)."""


def _read_text(path: Path, where: str, error: type[GpuinfraError], root: Path | None) -> str:
    try:
        if root is not None and path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(Path(root).resolve()):
                raise error(f"{where}: is a symlink to {target}, outside {Path(root).resolve()}; use a plain file")
        if not path.exists():
            raise error(f"{where}: does not exist")
        if path.is_dir():
            raise error(f"{where}: is a folder, not a file")
        if not path.is_file():
            raise error(f"{where}: is not a regular file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise error(f"{where}: is {size} bytes; at most {MAX_FILE_BYTES} are read")
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{where}: cannot be read: {exc.strerror or exc}") from None
    if b"\x00" in data:
        raise error(f"{where}: holds NUL bytes: a binary file, not YAML or JSON text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: is not UTF-8 text (byte {exc.start}): a binary file?") from None


def _shape(kind: type) -> str:
    return {dict: "mapping", list: "list", str: "string", type(None): "empty document"}.get(kind, kind.__name__)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated in one mapping and non-finite floats."""

    def construct_mapping(self, node, deep=False) -> dict:  # noqa: D102 (PyYAML hook)
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a `<<` merge key (yaml.org/type/merge.html): its keys may be overridden here
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise _Refused(f"line {key_node.start_mark.line + 1}: a mapping key must be a plain value") from None
            if key in seen:
                raise _Refused(
                    f"line {key_node.start_mark.line + 1}: key {key!r} appears twice in one mapping "
                    f"(first on line {seen[key]}); keep one"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_float(self, node) -> float:  # noqa: D102 (PyYAML hook)
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise _Refused(f"line {node.start_mark.line + 1}: {node.value!r} is not a finite number")
        return value


_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


def _parse_yaml(text: str) -> Any:
    _check_events(text)
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise _Refused(f"is not valid YAML: {_one_line(exc)}") from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # PyYAML's value builders raise these for a date like 2026-13-45, `!!int abc`, `!!set`
        # and integers beyond Python's digit limit
        raise _Refused(f"holds a value YAML cannot build: {_one_line(exc)}") from None
    _check_values(doc)
    return doc


def _check_events(text: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH and an alias expansion over MAX_NODES, from the
    event stream (no objects built yet)."""
    total = 0  # nodes so far, an alias counted as the size of what its anchor names
    opened: list[tuple[int, str | None]] = []  # per open collection: (total at its start, its anchor)
    anchored: dict[str, int] = {}
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(opened) >= MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    raise _Refused(f"line {line}: nests deeper than {MAX_DEPTH} levels of mappings and lists")
                opened.append((total, event.anchor))
                total += 1
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                start, anchor = opened.pop()
                if anchor:
                    anchored[anchor] = total - start
            elif isinstance(event, yaml.ScalarEvent):
                total += 1
                if event.anchor:
                    anchored[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                total += anchored.get(event.anchor or "", 1)
            if total > MAX_NODES:
                raise _Refused(f"expands to more than {MAX_NODES} values (anchors and aliases included)")
    except yaml.YAMLError as exc:
        raise _Refused(f"is not valid YAML: {_one_line(exc)}") from None


def _parse_json(text: str) -> Any:
    def pairs(items):
        out = {}
        for key, value in items:
            if key in out:
                raise _Refused(f"key {key!r} appears twice in one object; keep one")
            out[key] = value
        return out

    def constant(name):
        raise _Refused(f"{name} is not a finite number")

    def finite(text):
        value = float(text)
        if not math.isfinite(value):
            raise _Refused(f"{text} is not a finite number")
        return value

    try:
        doc = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=finite)
    except RecursionError:
        raise _Refused(f"nests deeper than {MAX_DEPTH} levels of objects and arrays") from None
    except ValueError as exc:
        raise _Refused(f"is not valid JSON: {_one_line(exc)}") from None
    _check_values(doc)
    return doc


def _check_values(doc: Any) -> None:
    """Depth within MAX_DEPTH, and no text with a lone surrogate (``"\\ud800"``: not a character,
    it cannot be printed or written as UTF-8), walked without recursion."""
    stack = [(doc, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise _Refused(f"holds text with a lone surrogate escape ({value[:40]!r}): not a character")
        elif isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                raise _Refused(f"nests deeper than {MAX_DEPTH} levels of objects and arrays")
            children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
