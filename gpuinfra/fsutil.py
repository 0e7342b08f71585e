"""Small file-system helpers: atomic writes, and several files written all or nothing, so
nothing half-written is ever left on disk."""

from __future__ import annotations

import contextlib
import errno
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


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be used as an existing folder ("does not exist", "is a file, not a
    folder"), or None when it is a folder."""
    path = Path(path)
    try:
        if path.is_dir():
            return None
        return "is a file, not a folder" if path.exists() else "does not exist"
    except OSError as exc:  # e.g. ENAMETOOLONG: a path longer than the file system takes
        return f"cannot be used: {exc.strerror or exc}"


class NewFiles:
    """Write several files all or nothing: on any error inside the ``with`` block (an
    interrupt too), the files and folders it created are removed again and the files it
    replaced get their old content back.

    Example::

        with NewFiles() as files:
            files.write(project / "Pulumi.yaml", text)
            files.write(project / "stacks" / "Pulumi.a.yaml", stack, exclusive=True)
    """

    def __init__(self) -> None:
        self._created: list[Path] = []
        self._replaced: list[tuple[Path, bytes]] = []

    def __enter__(self) -> NewFiles:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.rollback()

    def write(self, path: Path, text: str, *, exclusive: bool = False) -> None:
        """Create the missing parent folders, then :func:`atomic_write_text` ``path``.

        Raises:
            NotADirectoryError: a parent path exists and is not a folder.
            FileExistsError: ``exclusive`` and ``path`` exists.
            OSError: a folder or the file cannot be written.
        """
        path = Path(path)
        self._make_folders(path.parent)
        existed = path.exists()
        old = path.read_bytes() if existed and path.is_file() else None
        try:
            atomic_write_text(path, text, exclusive=exclusive)
        except FileExistsError:
            raise
        except OSError as exc:  # name the file, not its temporary sibling
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        if not existed:
            self._created.append(path)
        elif old is not None:
            self._replaced.append((path, old))

    def _make_folders(self, folder: Path) -> None:
        missing = []
        while not folder.is_dir():
            if folder.exists():
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
            missing.append(folder)
            folder = folder.parent
        for path in reversed(missing):
            path.mkdir()
            self._created.append(path)

    def rollback(self) -> None:
        """Put back what this object replaced, then remove what it created, newest first (best
        effort)."""
        for path, old in reversed(self._replaced):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                atomic_write_text(path, old.decode("utf-8"))
        self._replaced.clear()
        for path in reversed(self._created):
            try:
                if path.is_dir():
                    path.rmdir()
                else:
                    path.unlink()
            except OSError:
                pass
        self._created.clear()
