"""Tables that fit the terminal: each command declares its columns with a drop order, and
:func:`print_table` keeps as many as fit the width, dropping the lowest-priority ones first.

Width: ``$COLUMNS`` when set, else the terminal's width, else 80 columns (piped output, a file):
:func:`shutil.get_terminal_size` with an 80-column fallback. ``--wide`` keeps every column and
lets the table be as wide as it needs. A column is dropped whole, never cut: no cell, and so no
price, ever shows ``…``. Columns with ``drop=None`` (prices, GPUs, instance type, zone) are never
dropped; if those alone do not fit, the table is printed wider than the terminal instead of
truncated. A ``fold`` column (a component name, a source URL) wraps its cells into the width
that is left instead of setting the table's width: it needs ``fold_min`` characters, shares
what is left with the other fold columns, and is dropped in its turn when even ``fold_min``
does not fit.

The drop order of each table is documented in docs (the page for its command) and tested at 80
and 200 columns.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

#: Width when neither ``$COLUMNS`` nor a terminal says otherwise (shutil's fallback, 80 x 24).
FALLBACK_COLUMNS = 80

#: Measuring width for a table's natural (unwrapped) size: wider than any table here.
_UNBOUNDED_COLUMNS = 10_000


@dataclass(frozen=True)
class Col:
    """One column of a fitted table.

    ``drop``: None = never dropped; otherwise columns go in ascending ``drop`` order (1 first)
    until the table fits. ``fold``: the cells wrap into the width left over (at least
    ``fold_min`` characters) instead of setting the table's width.
    """

    header: str
    justify: Literal["left", "right", "center"] = "left"
    drop: int | None = None
    fold: bool = False
    fold_min: int = 24


def terminal_columns() -> int:
    """The width tables are fitted to: ``$COLUMNS``, else the terminal's, else 80."""
    return shutil.get_terminal_size((FALLBACK_COLUMNS, 24)).columns


def _build(
    columns: Sequence[Col],
    keep: Sequence[int],
    rows: Sequence[Sequence[Any]],
    table_kwargs: dict,
    fold_widths: dict[int, int],
) -> Table:
    from rich.table import Table

    table = Table(**table_kwargs)
    for i in keep:
        col = columns[i]
        if col.fold:
            table.add_column(col.header, justify=col.justify, overflow="fold", max_width=fold_widths[i])
        else:
            table.add_column(col.header, justify=col.justify, no_wrap=True)
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


def _natural_width(console: Console, table: Table) -> int:
    return console.measure(table, options=console.options.update_width(_UNBOUNDED_COLUMNS)).maximum


def _cell_width(cell: Any) -> int:
    """Printed width of a cell (a str with rich markup, or a rich Text)."""
    from rich.text import Text

    text = cell if isinstance(cell, Text) else Text.from_markup(str(cell))
    return max((Text(line).cell_len for line in text.plain.split("\n")), default=0)


def _share(columns: Sequence[Col], folds: Sequence[int], rows: Sequence[Sequence[Any]], left: int) -> dict[int, int]:
    """Widths of the fold columns: ``fold_min`` each plus ``left`` characters shared in
    proportion to how much more each one's longest cell needs."""
    need = {
        i: max(0, max([_cell_width(columns[i].header)] + [_cell_width(r[i]) for r in rows]) - columns[i].fold_min)
        for i in folds
    }
    total = sum(need.values())
    if total <= left:
        return {i: columns[i].fold_min + need[i] for i in folds}
    return {i: columns[i].fold_min + left * need[i] // total for i in folds}


def fit_columns(
    console: Console,
    columns: Sequence[Col],
    rows: Sequence[Sequence[Any]],
    width: int,
    *,
    wide: bool = False,
    **table_kwargs: Any,
) -> tuple[Table, int]:
    """The table of ``rows`` (one cell per column of ``columns``) with the columns that fit
    ``width`` characters, and the width to print it at (more than ``width`` only with ``wide``
    or when the never-dropped columns alone are wider). ``table_kwargs`` go to rich's Table."""
    keep = list(range(len(columns)))
    if wide:
        table = _build(columns, keep, rows, table_kwargs, dict.fromkeys(keep, _UNBOUNDED_COLUMNS))
        return table, max(width, _natural_width(console, table))
    order = sorted((c.drop, i) for i, c in enumerate(columns) if c.drop is not None)
    while True:
        folds = [i for i in keep if columns[i].fold]
        table = _build(columns, keep, rows, table_kwargs, {i: columns[i].fold_min for i in folds})
        used = _natural_width(console, table)
        if used <= width or not order:
            break
        keep.remove(order.pop(0)[1])
    if folds:  # the fold columns share what is left
        table = _build(columns, keep, rows, table_kwargs, _share(columns, folds, rows, max(0, width - used)))
    return table, max(width, used)


def print_table(
    console: Console, columns: Sequence[Col], rows: Sequence[Sequence[Any]], *, wide: bool = False, **table_kwargs: Any
) -> list[str]:
    """Fit the table to :func:`terminal_columns` (see :func:`fit_columns`), print it on
    ``console`` and return the headers of the columns shown."""
    width = terminal_columns()
    table, print_width = fit_columns(console, columns, rows, width, wide=wide, **table_kwargs)
    saved = console.width
    console.width = print_width
    try:
        console.print(table)
    finally:
        console.width = saved
    return [str(c.header) for c in table.columns]


def dropped_note(columns: Sequence[Col], shown: Sequence[str]) -> str | None:
    """``"(not shown at this width: a, b; --wide shows them)"`` or None when every column shows."""
    hidden = [c.header for c in columns if c.header not in shown]
    if not hidden:
        return None
    return f"not shown at {terminal_columns()} columns: {', '.join(hidden)} (--wide shows every column)"
