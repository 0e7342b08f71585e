"""Output helpers: tables and JSON to stdout, diagnostics to stderr.

Expected failures never print a traceback: :func:`gpuinfra.cli.main` turns a
:class:`~gpuinfra.errors.GpuinfraError` into ``error: <message>`` on stderr and its exit code.
"""

from __future__ import annotations

import json
import os
import sys
from decimal import Decimal
from typing import Any

from gpuinfra.cli.tables import terminal_columns  # standard library only: cheap at start-up


def stdout_console():
    """A rich Console on stdout (imported lazily: rich costs ~50 ms to import), as wide as
    :func:`gpuinfra.cli.tables.terminal_columns` says: ``$COLUMNS``, else the terminal, else 80
    (tables drop low-priority columns to fit; ``--wide`` shows them all).

    Text lines are wrapped at that width on a terminal or when ``$COLUMNS`` is set; piped output
    without ``$COLUMNS`` keeps each line whole (``soft_wrap``), so ``grep`` and logs see one line
    per message, while its tables still fit 80 columns."""
    from rich.console import Console

    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, soft_wrap=piped, width=terminal_columns())


def stderr_console():
    """A rich Console on stderr for notes and warnings."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout.

    ``data`` holds JSON types only: USD amounts arrive as :func:`gpuinfra.money.usd_json`
    strings, so a Decimal here (which would otherwise become a float) is a bug and raises
    TypeError.
    """
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def note(message: str) -> None:
    """A one-line note on stderr (kept out of stdout so ``--json | jq`` works)."""
    sys.stderr.write(message + "\n")


def usd(value: Decimal | None, places: int = 2) -> str:
    """``$12.34`` or ``-`` for None."""
    if value is None:
        return "-"
    return f"${value:,.{places}f}"
