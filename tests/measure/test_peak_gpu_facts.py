"""Peaks off the CPU, from faked device facts: no GPU or TPU here.

A device is stood in for by an object with what JAX's devices show gclab: `platform`
(``gpu``, ``tpu``, ``METAL``), `device_kind` and `memory_stats()` (a dict, or None). What is
checked is what gclab makes of those facts: which peak is a reading
(`device_peak_available`), when a fresh process is not started because this one holds too
much of the card (`refuse_if_held`), and how the chapters and the sweep show both.
"""

from __future__ import annotations

import io
import json
import os
import sys
import types

import jax
import pytest

from gclab import notebook
from gclab.config import ModelConfig, TaskConfig
from gclab.limits import format_bytes
from gclab.measure import peak
from gclab.measure.peak import (
    NOT_MEASURED,
    PeakResult,
    device_peak_available,
    held_bytes,
    measure_peak,
    refuse_if_held,
)
from gclab.sizing import StepSpec

H100 = 85_031_714_816  # what an H100 80GB HBM3 reports as its memory
LIMIT = int(0.75 * H100)  # JAX's pool at its default fraction: bytes_limit
TINY = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16, processor_steps=2)
SPEC = StepSpec(TINY, TaskConfig.from_levels(13))
TARGET = "gclab.measure.targets:allocate"


class FakeDevice:
    """A JAX device as gclab sees it: platform, kind and `memory_stats()`."""

    def __init__(self, platform="gpu", stats="fresh", kind="NVIDIA H100 80GB HBM3"):
        self.platform = platform
        self.device_kind = kind
        self.id = 0
        if stats == "fresh":  # a backend that started and allocated nothing
            stats = {"bytes_limit": LIMIT, "bytes_in_use": 0, "peak_bytes_in_use": 0,
                     "pool_bytes": 0}
        self.stats = stats

    def memory_stats(self):
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


def holding(pool_bytes, platform="gpu", **more):
    """A device whose process's JAX pool holds `pool_bytes` of the card."""
    return FakeDevice(platform, {"bytes_limit": LIMIT, "bytes_in_use": 0,
                                 "peak_bytes_in_use": 0, "pool_bytes": pool_bytes, **more})


@pytest.fixture(autouse=True)
def default_fraction(monkeypatch):
    """JAX's default share of a GPU (0.75), whatever the caller's environment says."""
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def on(monkeypatch):
    """`on(device, backend)`: this process's JAX shows `device` on `backend`."""
    def use(device, backend=None):
        monkeypatch.setattr(jax, "devices", lambda *a, **k: [device])
        monkeypatch.setattr(jax, "default_backend", lambda: backend or device.platform)
        return device

    return use


@pytest.fixture
def no_child(monkeypatch):
    """Fails the test if `measure_peak` starts its child process."""
    def started(*args, **kwargs):
        raise AssertionError("measure_peak started a child")

    monkeypatch.setattr(peak.subprocess, "run", started)


@pytest.fixture
def fake_measure(monkeypatch):
    """The fresh process of `measure_peak` stood in for: it reports `calls.result`. The
    parent's own checks (`refuse_if_held`) run as they are."""
    calls = types.SimpleNamespace(made=[], result=PeakResult("ok", backend="gpu",
                                                             peak_bytes=1250))

    def child(*args, input, **kwargs):
        calls.made.append(json.loads(input)["target"])
        r = calls.result
        report = {"status": r.status, "message": r.message, "backend": r.backend,
                  "peak_bytes": r.peak_bytes}
        return types.SimpleNamespace(stdout=peak._RESULT_PREFIX + json.dumps(report),
                                     stderr="", returncode=0)

    monkeypatch.setattr(peak.subprocess, "run", child)
    return calls


# ------------------------------------------------------------------- which peak is a reading


@pytest.mark.parametrize("stats, reading", [
    (None, False),                                        # a CPU, Apple's METAL
    ({}, False),
    ({"bytes_in_use": 0, "bytes_limit": LIMIT}, False),   # no peak counter
    ({"peak_bytes_in_use": -1}, False),                   # a counter not kept
    ({"peak_bytes_in_use": "12"}, False),
    ({"peak_bytes_in_use": True}, False),
    ({"peak_bytes_in_use": 0}, True),
    ({"peak_bytes_in_use": 123_456}, True),
])
def test_device_peak_available_is_a_count_of_bytes(stats, reading):
    assert device_peak_available(stats) is reading


def run_child(monkeypatch, capsys, track_heap=True):
    """`run_worker` in this process (as the fresh process runs it); its report."""
    payload = {"target": TARGET, "kwargs": {"nbytes": 4096}, "track_heap": track_heap}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(payload)))
    assert peak.run_worker() == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(peak._RESULT_PREFIX)
    return json.loads(line[len(peak._RESULT_PREFIX):])


@pytest.mark.parametrize("platform, stats, words", [
    ("METAL", None, "memory_stats() is None"),
    ("gpu", {"bytes_in_use": 0, "bytes_limit": LIMIT}, "has no peak_bytes_in_use"),
    ("gpu", {"bytes_in_use": 0, "bytes_limit": LIMIT, "peak_bytes_in_use": -1},
     "peak_bytes_in_use is -1"),
    ("tpu", RuntimeError("memory_stats is not supported"), "memory_stats() is None"),
])
def test_off_the_cpu_a_device_without_a_peak_gives_no_peak_and_never_host_memory(
        monkeypatch, capsys, on, platform, stats, words):
    on(FakeDevice(platform, stats))

    def no_memray(*args, **kwargs):
        raise AssertionError("memray traced host memory for a device's peak")

    import memray

    monkeypatch.setattr(memray, "Tracker", no_memray)
    report = run_child(monkeypatch, capsys)
    assert report["status"] == NOT_MEASURED
    assert "peak_bytes" not in report
    assert report["message"].startswith(f"not measured on {platform}: its device reports no "
                                        "peak") and words in report["message"]
    assert report["result"]["nbytes"] == 4096  # the workload itself ran


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_off_the_cpu_the_devices_peak_is_read(monkeypatch, capsys, on, platform):
    on(FakeDevice(platform, {"bytes_limit": LIMIT, "bytes_in_use": 10,
                             "peak_bytes_in_use": 777_000}))
    report = run_child(monkeypatch, capsys)
    assert report["status"] == "ok" and report["message"] == ""
    assert report["peak_bytes"] == 777_000


def test_the_fresh_process_reports_not_measured_to_its_caller(monkeypatch):
    """A child's 'not measured' comes back as such: no peak, no budget breach."""
    report = {"status": NOT_MEASURED, "message": "not measured on METAL: its device reports "
              "no peak (memory_stats() is None)", "backend": "METAL", "peak_rss_bytes": 2**40,
              "result": {"step_seconds": 0.5}}

    def child(*args, **kwargs):
        return types.SimpleNamespace(stdout=peak._RESULT_PREFIX + json.dumps(report),
                                     stderr="", returncode=0)

    monkeypatch.setattr(peak.subprocess, "run", child)
    r = measure_peak(TARGET, {}, budget_bytes=2**30)  # host RSS above a device budget
    assert (r.status, r.peak_bytes, r.ok) == (NOT_MEASURED, None, False)
    assert r.message == report["message"] and r.result == {"step_seconds": 0.5}


# ---------------------------------------------------------- what this process holds of a card


@pytest.mark.parametrize("stats, held", [
    (None, 0),
    ({}, 0),
    ({"bytes_in_use": 5}, 5),
    ({"bytes_in_use": 5, "bytes_reserved": 700}, 700),
    ({"bytes_in_use": 5, "pool_bytes": 9000, "bytes_reserved": 0}, 9000),
    ({"bytes_in_use": -1, "pool_bytes": None}, 0),
])
def test_held_bytes_reads_the_pool_where_there_is_one(stats, held):
    assert held_bytes(stats) == held


def test_a_child_is_not_started_where_this_process_holds_too_much_of_the_card(no_child):
    # A notebook kernel that preallocated (75% of an H100) and a plan of 30 GB: the card
    # keeps 25% for a fresh process, too little.
    result = measure_peak(TARGET, {}, device=holding(LIMIT), plan_bytes=30 * 10**9,
                          budget_bytes=2**40)
    assert result.status == NOT_MEASURED and not result.ok and result.peak_bytes is None
    assert result.message.startswith(f"not measured: this process holds {format_bytes(LIMIT)} "
                                     "of the gpu device's memory")
    assert format_bytes(30 * 10**9) in result.message and "\n" not in result.message
    assert (result.device, result.budget_bytes) == ("NVIDIA H100 80GB HBM3", 2**40)


def test_what_is_held_counts_against_the_card_and_the_childs_own_limit():
    card_left = H100 - LIMIT  # a preallocated pool leaves the card's last quarter
    assert refuse_if_held(holding(LIMIT), int(0.85 * card_left)) is None
    assert refuse_if_held(holding(LIMIT), int(0.95 * card_left)) is not None  # the margin
    # Holding a little: the child's own limit (not the card) bounds it.
    small = holding(2 * 2**30)
    assert refuse_if_held(small, int(0.85 * LIMIT)) is None
    assert refuse_if_held(small, int(0.95 * LIMIT)) is not None
    # bytes_in_use alone (no pool reported) counts as held too.
    in_use = FakeDevice("gpu", {"bytes_limit": LIMIT, "bytes_in_use": LIMIT - 2**20,
                                "peak_bytes_in_use": LIMIT - 2**20})
    assert refuse_if_held(in_use, 19 * 10**9) is None  # the card's quarter is still free
    assert refuse_if_held(in_use, 20 * 10**9).status == NOT_MEASURED


@pytest.mark.parametrize("preallocate, hint", [(None, True), ("true", True), ("false", False),
                                               ("False", False)])
def test_the_refusal_suggests_preallocation_off_only_where_it_is_on(monkeypatch, preallocate,
                                                                      hint):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    if preallocate is not None:
        monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", preallocate)
    message = refuse_if_held(holding(LIMIT), LIMIT).message
    assert message.startswith("not measured: this process holds "), message
    assert ("XLA_PYTHON_CLIENT_PREALLOCATE=false" in message) == hint, message
    assert message.count("\n") == 0


@pytest.mark.parametrize("device", [
    None,
    FakeDevice("cpu", None),
    FakeDevice("gpu", None),                         # nothing it reports to compare
    FakeDevice("gpu", {"pool_bytes": 10**12}),       # no limit
    FakeDevice("gpu", RuntimeError("no stats")),
    holding(0),                                      # holds nothing: the child's own OOM
], ids=["none", "cpu", "no-stats", "no-limit", "raises", "holds-nothing"])
def test_no_refusal_without_facts_to_refuse_on(device):
    assert refuse_if_held(device, 10**15) is None


def test_the_plan_is_worked_out_only_where_this_process_holds_some_of_the_card():
    asked = []

    def plan():
        asked.append(1)
        return 30 * 10**9

    assert refuse_if_held(holding(0), plan) is None and asked == []
    assert refuse_if_held(holding(LIMIT), plan).status == NOT_MEASURED and asked == [1]
    # An unknown plan is refused only where nothing is left at all.
    assert refuse_if_held(holding(LIMIT), lambda: None) is None
    whole = FakeDevice("tpu", {"bytes_limit": LIMIT, "bytes_in_use": LIMIT,
                               "peak_bytes_in_use": LIMIT})
    assert refuse_if_held(whole, None).status == NOT_MEASURED


def test_measure_peak_without_a_device_starts_no_backend_to_check(monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("a backend was started in the parent")

    monkeypatch.setattr(jax, "devices", started)
    monkeypatch.setattr(peak.subprocess, "run", lambda *a, **k: types.SimpleNamespace(
        stdout=peak._RESULT_PREFIX + json.dumps({"status": "ok", "peak_bytes": 1}),
        stderr="", returncode=0))
    assert measure_peak(TARGET, {}).peak_bytes == 1


# -------------------------------------------------------------- the chapters and the sweep


def test_planned_and_measured_measures_nothing_where_this_process_holds_the_card(
        on, fake_measure):
    on(holding(LIMIT))  # the kernel's pool: 75% of the card
    df = notebook.planned_and_measured({"big": SPEC}, plans={"big": (30 * 10**9, 10**9)})
    assert fake_measure.made == []
    assert df.loc["big", "measured_peak_bytes"] is None
    assert df.loc["big", "measured"].startswith(
        f"not measured: this process holds {format_bytes(LIMIT)}")
    # What the kernel leaves holds a smaller plan: that one is measured.
    df = notebook.planned_and_measured({"small": SPEC}, plans={"small": (10**9, 10**8)})
    assert len(fake_measure.made) == 1 and df.loc["small", "measured_peak_bytes"] == 1250


def test_planned_and_measured_measures_on_a_tpu(on, fake_measure):
    on(FakeDevice("tpu", kind="TPU v4"))
    fake_measure.result = PeakResult("ok", backend="tpu", peak_bytes=110_000_000)
    df = notebook.planned_and_measured({"live": SPEC}, plans={"live": (100_000_000, 10)})
    assert len(fake_measure.made) == 1
    assert df.loc["live", "measured_peak_bytes"] == 110_000_000
    assert df.loc["live", "measured_over_plan"] == pytest.approx(1.1)


def test_planned_and_measured_says_why_a_device_without_a_peak_is_not_measured(
        on, fake_measure):
    on(FakeDevice("METAL", None, kind="Apple M2 Max"))
    df = notebook.planned_and_measured({"live": SPEC}, plans={"live": (1000, 10)})
    assert fake_measure.made == []
    assert df.loc["live", "measured_peak_bytes"] is None
    assert df.loc["live", "measured"] == ("not measured on METAL: its device reports no peak "
                                          "(memory_stats() is None); host memory is no "
                                          "device peak")


def test_planned_and_measured_shows_the_fresh_process_reason_for_no_peak(on, fake_measure):
    on(FakeDevice("gpu"))
    why = "not measured on gpu: its device reports no peak (peak_bytes_in_use is -1)"
    fake_measure.result = PeakResult(NOT_MEASURED, message=why, backend="gpu")
    df = notebook.planned_and_measured({"live": SPEC}, plans={"live": (1000, 10)})
    assert df.loc["live", "measured"] == why  # not "run failed"
    assert df.loc["live", "measured_peak_bytes"] is None


@pytest.mark.parametrize("device, called", [
    (FakeDevice("tpu", kind="TPU v4"), True),
    (FakeDevice("METAL", None, kind="Apple M2 Max"), False),
    (holding(LIMIT), False),
], ids=["tpu", "metal", "held"])
def test_measured_peak_uses_the_same_rules(on, fake_measure, device, called):
    on(device)
    got = notebook.measured_peak(SPEC, plan_bytes=30 * 10**9)
    assert bool(fake_measure.made) is called
    assert got == (1250 if called else None)


def test_the_sweep_neither_measures_nor_caches_a_row_this_process_holds_the_card_for(
        monkeypatch, tmp_path, no_child):
    import importlib

    sweep_module = importlib.import_module("gclab.sizing.sweep")  # not gclab.sizing.sweep()
    device = holding(LIMIT)
    # The sweep's own backend (a CPU here) keys its cache; its device is the GPU's.
    monkeypatch.setattr(jax, "devices", lambda *a, **k: [device])
    monkeypatch.setattr(sweep_module, "train_step_memory",
                        lambda spec: types.SimpleNamespace(total_bytes=30 * 10**9))
    df = sweep_module.sweep([SPEC], measure="measured", cache_path=tmp_path, progress=False)
    row = df.iloc[0]
    assert row["status"] == NOT_MEASURED == row["measure_status"]
    assert row["message"].startswith(f"not measured: this process holds {format_bytes(LIMIT)}")
    assert row["peak_bytes"] is None
    assert list(tmp_path.iterdir()) == []  # not cached: the next run measures it


def test_a_recorded_configuration_whose_run_failed_on_the_card_is_shown_failed(tmp_path):
    scale = notebook.SCALE_TABLE["cpu"]
    part = notebook.GPU_RECORDING_PARTS["01"]
    row = {"chapter": "01", "label": "forward pass", "plan_bytes": 107_026_160,
           "temp_bytes": 100_285_736, "fits": True, "status": "runs (plan 102.07 MiB)",
           "peak_bytes": None, "step_seconds": None, "measured_over_plan": None}
    rows = [{**row, "label": "oom", "measure_status": "oom"},
            {**row, "label": "error", "measure_status": "error",
             "measure_message": "XlaRuntimeError: INTERNAL: failed\nmore"},
            {**row, "label": "ok", "measure_status": "ok", "peak_bytes": 110_000_000},
            {**row, "label": "recorded failed", "measure_status": "oom",
             "status": "failed on the card (oom, plan 102.07 MiB): RESOURCE_EXHAUSTED"}]
    record = {"hardware": {"backend": "gpu", "device": "NVIDIA H100 80GB HBM3", "jax": "x",
                           "commit": "c"}, "date": "2026-01-01", "rows": rows,
              "complete": True}
    (tmp_path / f"gpu-{scale.name}-{part}.json").write_text(json.dumps(record))
    _, table = notebook.gpu_recording("01", scale, data_dir=tmp_path)
    shown = dict(zip(table["configuration"], table["on the card"]))
    assert shown == {"oom": "failed on the card (oom)",
                     "error": "failed on the card (error): XlaRuntimeError: INTERNAL: failed",
                     "ok": "runs (plan 102.07 MiB)",
                     "recorded failed": rows[3]["status"]}


# ----------------------------------------------------------------------- the command line


def test_python_m_gclab_leaves_jax_preallocation_off_unless_set(monkeypatch):
    import gclab.__main__ as entry
    import gclab.cli

    seen = []

    def cli_main(argv=None):
        seen.append(os.environ.get(entry.PREALLOCATE_ENV))
        return 0

    monkeypatch.setattr(gclab.cli, "main", cli_main)
    monkeypatch.delenv(entry.PREALLOCATE_ENV, raising=False)
    assert entry.main(["--help"]) == 0
    monkeypatch.setenv(entry.PREALLOCATE_ENV, "true")  # the caller's choice stands
    assert entry.main(["--help"]) == 0
    assert seen == ["false", "true"]
