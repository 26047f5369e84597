"""Files gclab writes: checked before the work, written atomically.

Every file gclab writes (graph cache, sweep cache rows, sweep results, pictures) goes
through `atomic_path`: it is written under a temporary name in its own folder and
renamed into place (`os.replace`) only once complete, so a crash, a full disk or Ctrl-C
never leaves a half-written file under the real name for a later run to trust. Leftover
temporaries start with a dot and end in ``.tmp``; nothing reads them.

`check_output_path` tells, before any work starts, whether a path can be written;
`writable_folder` tells it of a folder.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, Optional, Union

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

    A file is written because permissions alone do not tell: a read-only mount, a full
    quota or an access-control list can refuse a write the mode bits allow (and root
    passes any mode bits).

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


_MISSING = ("refuse", "parent", "create")


def writable_folder(folder: PathLike, *,
                    missing: Literal["refuse", "parent", "create"] = "refuse",
                    what: Optional[PathLike] = None) -> Path:
    """Checks, before any work, that files can be written in `folder`.

    An existing folder is written to once (`check_writable_folder`); anything else at that
    path is refused. A missing folder is refused (``missing="refuse"``), accepted where the
    nearest existing folder above it can be written in (``"parent"``: nothing is created,
    the work makes it later), or made with its parents and then checked (``"create"``).

    Args:
      folder: the folder.
      missing: what a missing folder is: "refuse", "parent" or "create".
      what: the path the error names (default: the folder); where it is not the folder,
        the reason names the folder.

    Returns:
      The folder.

    Raises:
      OutputPathError: something other than a folder at that path (or, with "parent", the
        nearest existing path above it), a symbolic link to nothing there, a missing folder
        with "refuse", a path that cannot be looked at, a folder that cannot be made, or
        one where no file can be created.
      ValueError: `missing` is none of the allowed values.
    """
    if missing not in _MISSING:
        raise ValueError(f"missing={missing!r}: one of {', '.join(_MISSING)}")
    folder = Path(folder)
    named = what is not None and Path(what) != folder
    what = what if what is not None else folder

    def exists(path: Path) -> bool:
        try:
            return path.exists()
        except OSError as e:  # a folder above it that may not be searched
            raise OutputPathError(what, f"cannot look at {e.filename or path} "
                                  f"({e.strerror or e})") from None

    present = exists(folder)
    if not present and folder.is_symlink():
        # A link to nothing (or to itself): `exists` reads it as missing, and making the
        # folder would fail on the link ("File exists") after the checks passed.
        raise OutputPathError(what, f"{folder} is a symbolic link to {os.readlink(folder)}, "
                              "which does not exist")
    if present:
        if not folder.is_dir():
            raise OutputPathError(what, f"{folder} is not a folder" if named else
                                  "not a folder")
        return check_writable_folder(folder, what)
    if missing == "refuse":
        raise OutputPathError(what, f"folder {folder} does not exist" if named else
                              "no such folder")
    if missing == "parent":
        existing = next(p for p in folder.parents if exists(p))
        if not existing.is_dir():
            raise OutputPathError(what, f"{existing} is not a folder")
        check_writable_folder(existing, what)
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(what, f"cannot create folder {folder} ({e.strerror or e})"
                              ) from None
    return check_writable_folder(folder, what)
