"""Benchmark: the book's chapters executed on this machine's accelerator, one after another,
until a deadline.

Each chapter runs as CI runs it (``pytest --nbmake``, in a kernel of its own), alone on the
device: chapters side by side would share one card, and each sizes what it runs live by the
memory the device has free. They run in the order given (``--chapters``: what to learn
first, first), each with what is left of ``--deadline``, so that a machine lent for a few
minutes answers the most important question before it goes back. The result of each chapter
is one of: passed, failed (with the line of the error that stopped it), stopped at the
deadline, or not started; with its seconds. The record, with the hardware, date, scale and
commit, is rewritten after every chapter, so that a run cut short keeps what it got:
``benchmarks/results/book-<backend>-<scale>.json`` (or ``--out``). An earlier record at the
same path is first moved beside it (``<name>.previous.json``), as `record_gpu.py` does.

The executed notebooks, with their outputs, are written back to the chapters' files only
with ``--keep-outputs`` (a copy of the tree that is thrown away, say); by default the
chapters run from a temporary copy and the checkout's notebooks stay as they are.

    python benchmarks/book_device.py --chapters 02,03 --deadline 540
    python benchmarks/book_device.py --list           # the chapters and their order

On a machine without an accelerator it refuses (one line, exit status 2) unless given
``--allow-cpu``: the CPU build is timed by `book_build.py`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import yaml
from children import child_env
from record_gpu import hardware, set_aside

ROOT = Path(__file__).resolve().parent.parent
PROG = "book_device.py"
#: Seconds a chapter must have left to be started at all: less is spent starting a kernel.
MIN_SECONDS = 45
#: The longest deadline taken: a day.
MAX_SECONDS = 86400
#: pytest's line for a failed notebook: ``FAILED book/x.ipynb::x.ipynb - Error: message``.
FAILED_LINE = re.compile(r"^FAILED \S+ - (.+)$", re.M)
#: Colour codes in a kernel's traceback.
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def book_chapters(book: Path) -> list[str]:
    """The notebooks of the book's table of contents (``_toc.yml``), in its order, as file
    stems; for another folder (``--book``), its notebooks in name order."""
    if book.resolve() == (ROOT / "book").resolve():
        toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
        files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
        return [Path(f).name for f in files if (ROOT / f"{f}.ipynb").exists()]
    return sorted(p.stem for p in book.glob("*.ipynb"))


def choose(chapters: list[str], asked: Optional[str]) -> list[str]:
    """The chapters `asked` names (comma-separated stems or their unique prefixes, such as
    ``02``), in that order; all of them where `asked` is None.

    Raises:
      ValueError: a name that is no chapter's, or one that names two.
    """
    if asked is None:
        return list(chapters)
    out = []
    for name in (n.strip() for n in asked.split(",")):
        matches = ([c for c in chapters if c == name]
                   or [c for c in chapters if c.startswith(name)]) if name else []
        if len(matches) != 1:
            found = "names no chapter" if not matches else f"names {len(matches)} chapters"
            raise ValueError(f"--chapters {name!r} {found}: give one of "
                             f"{', '.join(chapters)} (or a prefix naming one, such as 02)")
        if matches[0] not in out:
            out.append(matches[0])
    return out


def outcome(returncode: Optional[int], output: str) -> dict:
    """A chapter's status from pytest's exit status (None: stopped at the deadline) and
    output: ``status`` and, where it failed, ``error``: the line pytest gives its failure."""
    if returncode is None:
        return {"status": "stopped at the deadline"}
    if returncode == 0:
        return {"status": "passed"}
    found = FAILED_LINE.findall(ANSI.sub("", output))
    return {"status": "failed",
            "error": found[-1].strip() if found else f"pytest exit status {returncode}"}


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children first, from ``/proc`` (Linux). A kernel runs in a
    process session of its own (jupyter_client starts it so), and what it starts (a
    measuring process, say) in its own, so no one process group holds them all.
    (psutil's `Process.children(recursive=True)` does this, but gclab does not depend on
    psutil, and ``/proc`` is all the device machines need.)"""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:  # the field after the command's closing parenthesis: state, then ppid
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # ended meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop(child: subprocess.Popen) -> None:
    """Kills `child` and every process below it."""
    for pid in [*descendants(child.pid), child.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_chapter(path: Path, seconds: float, env: dict) -> tuple[Optional[int], str]:
    """Runs one notebook through nbmake for at most `seconds`; (exit status or None where
    the time ran out, its output). Whatever way this returns or is interrupted, nothing the
    chapter started is left running (on a GPU it would hold the card)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "no:randomly", "-o", "addopts=", "--nbmake",
               f"--nbmake-timeout={max(1, int(seconds))}", "--overwrite", str(path)]
    child = subprocess.Popen(command, cwd=path.parent, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=seconds)
        return child.returncode, output
    except subprocess.TimeoutExpired:
        stop(child)
        output, _ = child.communicate()
        return None, output
    finally:
        if child.poll() is None or descendants(child.pid):  # interrupted: stop them all
            stop(child)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapters", help="comma-separated chapters, in the order to run "
                        "them (stems or prefixes, e.g. 02,03); default: the whole book")
    parser.add_argument("--deadline", type=float, default=540.0,
                        help="seconds for all the chapters together (default 540)")
    parser.add_argument("--out", type=Path, help="the record's path (default "
                        "benchmarks/results/book-<backend>-<scale>.json)")
    parser.add_argument("--book", type=Path, default=ROOT / "book",
                        help="the folder of the notebooks (default: the book)")
    parser.add_argument("--keep-outputs", action="store_true",
                        help="write the executed notebooks over the chapters' files")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run on a machine without an accelerator too")
    parser.add_argument("--list", action="store_true", help="list the chapters and exit")
    args = parser.parse_args(argv)
    if not args.book.is_dir():
        return fail(f"--book {args.book}: not a folder")
    chapters = book_chapters(args.book)
    if not chapters:
        return fail(f"--book {args.book}: no notebooks in it")
    try:
        order = choose(chapters, args.chapters)
    except ValueError as e:
        return fail(str(e))
    if args.list:
        print("\n".join(order))
        return 0
    if not MIN_SECONDS < args.deadline <= MAX_SECONDS:  # NaN and inf too
        return fail(f"--deadline {args.deadline:g}: a number of seconds above {MIN_SECONDS} "
                    f"(the least a chapter is started with) and at most {MAX_SECONDS}")
    if args.out is not None and args.out.is_dir():
        return fail(f"--out {args.out}: a folder; give the record's file path, such as "
                    f"{args.out / 'book.json'}")

    env = child_env(XLA_PYTHON_CLIENT_PREALLOCATE="false")
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # this process's JAX too
    import jax

    from gclab.files import write_text_atomic
    from gclab.notebook import SettingError, choose_scale

    backend = jax.default_backend()
    if backend == "cpu" and not args.allow_cpu:
        return fail("no accelerator found (JAX backend 'cpu'): give --allow-cpu to run the "
                    "chapters on the CPU anyway, or time the CPU build with book_build.py")
    try:
        scale = choose_scale()
    except SettingError as e:
        return fail(str(e))
    out = args.out or ROOT / "benchmarks" / "results" / f"book-{backend}-{scale.name}.json"
    head = {"hardware": hardware(), "scale": scale.name, "deadline_seconds": args.deadline,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    rows: list[dict] = []
    set_aside(out, PROG)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        write_text_atomic(out, json.dumps({**head, "chapters": rows}, indent=1))

    # A lease that ends sends SIGTERM: leave through `run_chapter`'s cleanup, not around it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gclab_book_") as scratch:
        folder = args.book if args.keep_outputs else Path(shutil.copytree(
            args.book, Path(scratch) / args.book.name))
        for chapter in order:
            left = args.deadline - (time.monotonic() - start)
            if left < MIN_SECONDS:
                rows.append({"chapter": chapter, "status": "not started",
                             "seconds_left": round(max(left, 0.0), 1)})
                print(f"{chapter}: not started, {max(left, 0.0):.0f} s left", flush=True)
                save()
                continue
            began = time.monotonic()
            returncode, output = run_chapter(folder / f"{chapter}.ipynb", left, env)
            row = {"chapter": chapter, **outcome(returncode, output),
                   "seconds": round(time.monotonic() - began, 1)}
            rows.append(row)
            print(f"{chapter}: {row['status']} in {row['seconds']:.0f} s"
                  + (f": {row['error']}" if "error" in row else ""), flush=True)
            save()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
