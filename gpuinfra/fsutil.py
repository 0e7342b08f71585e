"""Small file-system helpers: atomic writes so nothing half-written is ever left on disk."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str, *, exclusive: bool = False) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename.

    Args:
        path: destination file; its parent folder must exist.
        text: full content (UTF-8).
        exclusive: when True, fail if ``path`` already exists at rename time.

    Raises:
        FileExistsError: ``exclusive`` and the file exists.
        OSError: the folder is not writable.
    """
    path = Path(path)
    umask = os.umask(0)
    os.umask(umask)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask)
        if exclusive:
            os.link(tmp, path)  # fails with FileExistsError instead of replacing
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
