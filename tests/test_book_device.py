"""`benchmarks/book_device.py`: the chapters on a device, one after another, to a deadline."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "book_device.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import book_device  # noqa: E402


def _run(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GCLAB_SCALE", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _notebook(path: Path, *cells: str) -> None:
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}",
                   "metadata": {}, "outputs": [], "source": source}
                  for i, source in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                    "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5}))


def test_it_refuses_without_an_accelerator_and_writes_nothing(tmp_path):
    out = tmp_path / "book.json"
    r = _run("--chapters", "01", "--out", str(out))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        "book_device.py: error: no accelerator found (JAX backend 'cpu'): give --allow-cpu "
        "to run the chapters on the CPU anyway, or time the CPU build with book_build.py")
    assert not out.exists()


def test_it_lists_the_book_in_the_order_asked():
    r = _run("--list")
    assert r.returncode == 0
    assert r.stdout.split() == [
        "01_graphcast", "02_forward_activations", "03_remat", "04_xla_fusion",
        "05_mixed_precision", "06_scaling", "07_full_resolution", "08_beyond_one_device",
        "appendix_measuring_memory"]
    assert _run("--list", "--chapters", "03,02,03").stdout.split() == [
        "03_remat", "02_forward_activations"]


@pytest.mark.parametrize("args, message", [
    (("--chapters", "09"), "--chapters '09' names no chapter: give one of 01_graphcast, "),
    (("--chapters", "0"), "--chapters '0' names 8 chapters: give one of 01_graphcast, "),
    (("--chapters", "02,"), "--chapters '' names no chapter"),
    (("--deadline", "30"), "--deadline 30: a number of seconds above 45 (the least a "
                           "chapter is started with)"),
    (("--deadline", "nan"), "--deadline nan: a number of seconds above 45"),
    (("--deadline", "inf"), "--deadline inf: a number of seconds above 45 (the least a "
                            "chapter is started with) and at most 86400"),
    (("--out", "benchmarks"), "--out benchmarks: a folder; give the record's file path, such "
                              "as benchmarks/book.json"),
    (("--book", "no-such-folder"), "--book no-such-folder: not a folder"),
])
def test_bad_arguments_get_one_line(args, message):
    r = _run(*args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"book_device.py: error: {message}")
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_run_records_each_chapter_and_leaves_the_notebooks_as_they_were(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    _notebook(book / "a_good.ipynb", "x = 1 + 1\nprint(x)")
    _notebook(book / "b_bad.ipynb", "raise ValueError('the second chapter breaks')")
    before = {p.name: p.read_text() for p in book.iterdir()}
    out = tmp_path / "record.json"
    r = _run("--book", str(book), "--allow-cpu", "--deadline", "240", "--out", str(out),
             "--chapters", "b,a")
    assert r.returncode == 0, r.stderr
    record = json.loads(out.read_text())
    assert record["hardware"]["backend"] == "cpu" and record["scale"] == "cpu"
    assert [(c["chapter"], c["status"]) for c in record["chapters"]] == [
        ("b_bad", "failed"), ("a_good", "passed")]
    assert record["chapters"][0]["error"].endswith("ValueError: the second chapter breaks")
    assert all(c["seconds"] > 0 for c in record["chapters"])
    assert {p.name: p.read_text() for p in book.iterdir()} == before


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie counts: it runs nothing)."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_a_chapter_past_its_time_is_stopped_with_all_it_started(tmp_path):
    # The kernel runs in a session of its own, and so does what it starts: killing pytest's
    # process group left a measuring process behind, holding the card into the next chapter.
    pids = tmp_path / "pids"
    _notebook(tmp_path / "slow.ipynb", "import os, subprocess, sys, time\n"
              "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
              " start_new_session=True)\n"
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{worker.pid}}')\n"
              "time.sleep(300)")
    returncode, _ = book_device.run_chapter(tmp_path / "slow.ipynb", 12, dict(os.environ))
    assert returncode is None
    kernel, worker = map(int, pids.read_text().split())
    assert _gone(kernel) and _gone(worker)
    assert book_device.outcome(None, "") == {"status": "stopped at the deadline"}
    assert book_device.outcome(0, "") == {"status": "passed"}
    colour = "FAILED book/x.ipynb::x.ipynb - \x1b[31mJaxRuntimeError\x1b[39m: INVALID_ARGUMENT"
    assert book_device.outcome(1, f"...\n{colour}\n1 failed") == {
        "status": "failed", "error": "JaxRuntimeError: INVALID_ARGUMENT"}
    assert book_device.outcome(4, "no line") == {"status": "failed",
                                                 "error": "pytest exit status 4"}
