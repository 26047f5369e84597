"""Paths the user may not search or write in, and values the system takes in a narrower
range than Python: one line that names the option, before any work.

Permissions do not hold for root (as on many CI machines), so each refusal is also shown
with the file system's answer simulated (`PermissionError` where the operating system
would give it); the real `chmod` cases run where the tests do not run as root.
"""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
import sys
import tempfile
import warnings

import pytest

from gclab import cli, files
from gclab.config import MAX_INT32

TINY_NET = ["--resolution", "6", "--mesh-splits", "2", "--latent", "16", "--steps", "2"]
AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def no_work(monkeypatch):
    """Fails a test if a command gets as far as building graphs or compiling."""

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the input was checked")

    for name in ("load_or_build_graphs", "compile_train_step", "train", "compute_stats"):
        if hasattr(cli, name):
            monkeypatch.setattr(cli, name, refuse)


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"gclab {command}: error: ") and "Traceback" not in err, err
    return err


def _denied(path) -> PermissionError:
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A folder `ro` in which no file can be created (simulated where the tests run as root,
    whom permissions do not stop)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if AS_ROOT:
        real = tempfile.mkstemp

        def mkstemp(*args, dir=None, **kwargs):
            if dir is not None and pathlib.Path(dir).resolve() == folder.resolve():
                raise _denied(dir)
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    else:
        folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)


@pytest.fixture
def closed(tmp_path, monkeypatch):
    """A folder `closed` that may not be searched: looking at any path inside it fails."""
    folder = tmp_path / "closed"
    folder.mkdir()
    if AS_ROOT:
        real = pathlib.Path.stat

        def stat(self, *args, **kwargs):
            if folder in pathlib.Path(os.path.abspath(self)).parents:
                raise _denied(self)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, "stat", stat)
    else:
        folder.chmod(0)
    yield folder
    folder.chmod(0o755)


def test_an_unwritable_checkpoint_folder_is_refused_before_training(read_only, capsys,
                                                                      no_work):
    """Found after every step had run, by orbax's save (pages of tracebacks, then a hang)."""
    for target in (read_only, read_only / "new"):  # as it is, and a folder to create there
        assert cli.main(["train", *TINY_NET, "--train-steps", "3",
                         "--checkpoint-dir", str(target)]) == 2
        err = one_line_error(capsys, "train")
        assert f"--checkpoint-dir {target}: cannot write in folder {read_only}" in err


def test_a_new_output_folder_under_a_read_only_one_is_refused_first(read_only, tmp_path,
                                                                    capsys, no_work):
    data = tmp_path / "data.nc"
    data.write_bytes(b"")  # never read: the output is checked first
    assert cli.main(["stats", "--out", str(read_only / "new"), "--data", str(data)]) == 2
    assert f"--out {read_only / 'new'}: cannot write in folder {read_only}" in one_line_error(
        capsys, "stats")


CLOSED_CASES = [
    # (command, the option, argv with CLOSED for the folder that may not be searched)
    ("graph", "--save", ["graph", "--resolution", "6", "--mesh-splits", "2",
                         "--save", "CLOSED/g.npz"]),
    ("train", "--checkpoint-dir", ["train", *TINY_NET, "--train-steps", "1",
                                   "--checkpoint-dir", "CLOSED/ck"]),
    ("stats", "--data", ["stats", "--data", "CLOSED/data.nc", "--out", "OUT"]),
    ("forecast", "--stats", ["forecast", "--stats", "CLOSED"]),
]


@pytest.mark.parametrize("command,option,argv", CLOSED_CASES,
                         ids=[f"{c} {o}" for c, o, _ in CLOSED_CASES])
def test_a_path_in_a_folder_that_may_not_be_searched_is_one_line(command, option, argv, closed,
                                                                 tmp_path, capsys, no_work):
    argv = [a.replace("CLOSED", str(closed)).replace("OUT", str(tmp_path / "out"))
            for a in argv]
    assert cli.main(argv) == 2
    err = one_line_error(capsys, command)
    assert f"{option} {closed}" in err and "cannot look at it (" in err  # a file within, named
    assert err.endswith("Permission denied) (see gclab " + command + " --help)\n"), err


def test_a_sweep_cache_in_a_folder_that_may_not_be_searched_names_the_variable(
        closed, monkeypatch, capsys, no_work):
    monkeypatch.setenv("GCLAB_SWEEP_CACHE", str(closed / "cache"))
    monkeypatch.setattr(cli, "sweep", lambda *a, **k: pytest.fail("the sweep started"))
    code = cli.main(["sweep", *TINY_NET, "--out", str(closed.parent / "rows.json")])
    assert code == 2
    assert f"GCLAB_SWEEP_CACHE={closed / 'cache'}: " in one_line_error(capsys, "sweep")


def test_a_coordinator_timeout_jax_cannot_take_is_refused(capsys, no_work):
    """JAX takes our timeout plus the grace as a 32-bit count of seconds (a TypeError
    traceback past it)."""
    largest = MAX_INT32 - cli.JOIN_GRACE_SECONDS
    assert cli.main(["train", *TINY_NET, "--train-steps", "1", "--coordinator",
                     "localhost:23456", "--num-processes", "1",
                     "--coordinator-timeout", str(largest + 1)]) == 2
    assert f"--coordinator-timeout {largest + 1}: an integer >= 1 (and <= {largest})" in (
        one_line_error(capsys, "train"))


def test_digits_python_reads_but_int_does_not_are_refused(monkeypatch, capsys, no_work):
    """'²' is a digit to `str.isdigit` but not a number to `int`."""
    assert cli.main(["train", *TINY_NET, "--train-steps", "1", "--coordinator", "h:²"]) == 2
    assert "--coordinator h:²: HOST:PORT with PORT in 1..65535" in one_line_error(
        capsys, "train")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "²")
    assert cli.main(["train", *TINY_NET, "--train-steps", "1"]) == 2
    assert "JAX_NUM_PROCESSES=" in one_line_error(capsys, "train")


def test_a_warning_while_an_input_is_read_is_one_line(tmp_path, monkeypatch, capsys, no_work):
    """Inputs are read as the options are parsed (xarray warns of a zarr store without
    consolidated metadata, say): such a warning is one line too, as during the work."""

    def warns_then_refuses(text):
        warnings.warn("the store has no consolidated metadata", RuntimeWarning, stacklevel=2)
        raise cli.argparse.ArgumentTypeError(f"{text}: not a dataset")

    monkeypatch.setattr(cli, "_dataset", warns_then_refuses)
    assert cli.main(["stats", "--data", str(tmp_path / "x.zarr"),
                     "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "gclab stats: warning: the store has no consolidated metadata", err
    assert len(err) == 2 and err[1].startswith("gclab stats: error: --data "), err


@pytest.mark.skipif(os.name != "posix", reason="file names as bytes: POSIX")
def test_a_file_name_that_is_not_text_in_the_locale_is_written_and_said(tmp_path):
    """A strict UTF-8 stream (an `en_US.UTF-8` locale, say) cannot print a Latin-1 name: the
    command would fail, exit 2, after writing the file."""
    name = os.fsdecode(b"g\xff.npz")
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict",
               GCLAB_CACHE_DIR=str(tmp_path / "graphs"))
    proc = subprocess.run([sys.executable, "-m", "gclab", "graph", "--resolution", "6",
                           "--mesh-splits", "2", "--save", name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, errors="backslashreplace")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / name).is_file() and "saved to g\\udcff.npz" in proc.stdout


# gclab.files.writable_folder: what each way of taking a missing folder accepts and refuses.
MODES = ["refuse", "parent", "create"]


def _refusal(folder, **kwargs) -> files.OutputPathError:
    with pytest.raises(files.OutputPathError) as refused:
        files.writable_folder(folder, **kwargs)
    return refused.value


@pytest.mark.parametrize("missing", MODES)
def test_writable_folder_takes_an_existing_folder_and_leaves_nothing_in_it(tmp_path, missing):
    assert files.writable_folder(str(tmp_path), missing=missing) == tmp_path
    assert list(tmp_path.iterdir()) == []


def test_writable_folder_takes_a_missing_folder_as_its_mode_says(tmp_path):
    new = tmp_path / "a" / "b"
    refused = _refusal(new)  # "refuse" unless told
    assert (refused.path, refused.reason) == (new, "no such folder")
    assert _refusal(new, what="x.json").reason == f"folder {new} does not exist"
    assert files.writable_folder(new, missing="parent") == new
    assert not (tmp_path / "a").exists()  # "parent" makes nothing
    assert files.writable_folder(new, missing="create") == new
    assert new.is_dir() and list(new.iterdir()) == []


@pytest.mark.parametrize("missing", MODES)
def test_writable_folder_refuses_a_file_in_the_way_and_keeps_it(tmp_path, missing):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("kept\n")
    refused = _refusal(in_the_way, missing=missing)
    assert (refused.path, refused.reason) == (in_the_way, "not a folder")
    named = _refusal(in_the_way, missing=missing, what=in_the_way / "x.json")
    assert (named.path, named.reason) == (in_the_way / "x.json", f"{in_the_way} is not a folder")
    below = _refusal(in_the_way / "sub", missing=missing).reason  # a file above it
    assert below.startswith({"refuse": "no such folder",
                             "parent": f"{in_the_way} is not a folder",
                             "create": f"cannot create folder {in_the_way / 'sub'} ("}[missing]
                            ), below
    assert in_the_way.read_text() == "kept\n"


@pytest.mark.parametrize("missing", MODES)
def test_writable_folder_refuses_a_folder_no_file_can_be_created_in(read_only, missing):
    reason = f"cannot write in folder {read_only} (Permission denied)"
    assert _refusal(read_only, missing=missing).reason == reason
    if missing == "parent":  # a folder to make there later: refused now
        refused = _refusal(read_only / "new" / "deeper", missing=missing)
        assert (refused.path, refused.reason) == (read_only / "new" / "deeper", reason)


def test_writable_folder_says_a_folder_that_cannot_be_made(tmp_path, monkeypatch):
    """The OS refuses to make it (simulated: permissions do not stop root, who runs CI)."""

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "mkdir", refuse)
    new = tmp_path / "new" / "deeper"
    refused = _refusal(new, missing="create")
    assert (refused.path, refused.reason) == (
        new, f"cannot create folder {new} (Permission denied)")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("missing", MODES)
@pytest.mark.parametrize("target", ["nowhere", "self"])
def test_writable_folder_refuses_a_link_to_nothing_and_keeps_it(tmp_path, missing, target):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "nowhere" if target == "nowhere" else link)
    refused = _refusal(link, missing=missing)
    assert (refused.path, refused.reason) == (
        link, f"{link} is a symbolic link to {os.readlink(link)}, which does not exist")
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("missing", MODES)
def test_writable_folder_in_a_folder_that_may_not_be_searched_is_one_error(closed, missing):
    refused = _refusal(closed / "cache", missing=missing)
    assert refused.reason.startswith("cannot look at ") and refused.reason.endswith(
        "(Permission denied)"), refused.reason


def test_writable_folder_refuses_an_unknown_mode_in_one_line(tmp_path):
    with pytest.raises(ValueError) as refused:
        files.writable_folder(tmp_path, missing="make")
    assert str(refused.value) == "missing='make': one of refuse, parent, create"
