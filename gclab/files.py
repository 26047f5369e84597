"""Files gclab writes: checked before the work, written atomically.

Every file gclab writes (graph cache, sweep cache rows, sweep results, pictures) goes
through `atomic_path`: it is written under a temporary name in its own folder and
renamed into place (`os.replace`) only once complete, so a crash, a full disk or Ctrl-C
never leaves a half-written file under the real name for a later run to trust. Leftover
temporaries start with a dot and end in ``.tmp``; nothing reads them.

`check_output_path` tells, before any work starts, whether a path can be written.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Optional, Union

from gclab.config import a_kind

PathLike = Union[str, os.PathLike]


class CacheWarning(UserWarning):
    """A cache entry that was damaged or could not be written (the work went on)."""


class OutputPathError(ValueError):
    """An output path that cannot be written (checked before any work).

    Attributes:
      path: the path.
      reason: what is wrong, without the path ("folder x does not exist").
    """

    def __init__(self, path: PathLike, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = Path(path), reason


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def link_target(path: PathLike) -> Optional[Path]:
    """Where a symbolic link at `path` leads (its target, which may not exist), or None if
    `path` is no link: a file or folder written at a link is written there (`atomic_path`),
    so checks before work look there too."""
    return Path(os.path.realpath(path)) if Path(path).is_symlink() else None


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary path to write; on success it replaces `path` in one rename.

    Example::

        with atomic_path("plot.png") as tmp:
            fig.savefig(tmp, format="png")

    Args:
      path: the file to (re)write; its folder must exist.

    Yields:
      A temporary file's path in the same folder (it exists, empty).

    Raises:
      OSError: the folder cannot be written; nothing is left behind.
    """
    path = Path(os.path.realpath(path))  # through a symbolic link: replace its target
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # as a plain open() would have made it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: PathLike, text: str) -> Path:
    """Writes `text` (UTF-8) to `path` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def check_output_path(path: PathLike, suffixes: Optional[Sequence[str]] = None) -> Path:
    """Checks, before any work, that a file can be written at `path`.

    A symbolic link is checked where `atomic_path` writes: at its target, in the target's
    folder (a link whose target does not exist yet is an output like any other, but its
    target's folder must exist).

    Args:
      path: the file to write.
      suffixes: allowed suffixes (lower case, with the dot), or None for any.

    Returns:
      The path.

    Raises:
      OutputPathError: a wrong suffix, an existing folder of that name, something that
        is not a regular file (a device such as /dev/null, a pipe), a missing folder, or a
        folder where no file can be created (the message says which).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OutputPathError(str(path), f"a path must be a str or os.PathLike, not "
                              f"{a_kind(path)}")
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(path, "is a directory, not a file")
    if path.exists() and not path.is_file():
        raise OutputPathError(path, "exists and is not a regular file (gclab replaces the "
                              "file it writes)")
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise OutputPathError(path, f"the name must end in {', '.join(suffixes)}")
    # A link is written at its target (`atomic_path`), so its target's folder is checked,
    # and named: a dangling link's own folder tells nothing.
    target = link_target(path)
    folder = (target or path).parent
    where = f"a symbolic link to {target}, whose folder " if target else ""
    if not folder.exists():
        raise OutputPathError(path, f"{where or 'folder '}{folder} does not exist")
    if not folder.is_dir():
        raise OutputPathError(path, f"{where}{folder} is not a directory")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(path, "the file exists and is read-only")
    check_writable_folder(folder, path)
    return path


def check_writable_folder(folder: PathLike, what: Optional[PathLike] = None) -> Path:
    """Checks that a file can be created in `folder` (by creating and removing one).

    Args:
      folder: an existing folder.
      what: the path the error names (default: the folder).

    Returns:
      The folder.

    Raises:
      OutputPathError: no file can be created there (read-only, no permission, ...).
    """
    folder = Path(folder)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gclab-write-check.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise OutputPathError(what or folder, f"cannot write in folder {folder} "
                              f"({e.strerror or e})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    return folder

