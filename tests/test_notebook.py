"""The chapters' shared helpers: hardware report, scale choice, recorded measurements."""

import dataclasses
import json
import re

import numpy as np
import pytest

from gclab.config import get_preset
from gclab.notebook import (
    SCALE_TABLE,
    SCALES,
    Scale,
    choose_scale,
    hardware_report,
    recorded,
)


def test_hardware_report_names_backend_device_versions_and_date():
    report = hardware_report()
    for key in ("backend", "device", "device memory", "host memory", "cpu cores", "versions",
                "date"):
        assert key in report
    assert report["backend"] == "cpu"
    assert "jax " in report["versions"] and "gclab " in report["versions"]
    text = str(report)
    assert [line.split("  ")[0].strip() for line in text.splitlines()
            if not line.startswith(" ")] == list(report)


def test_hardware_report_prints_long_values_on_lines_of_their_own(monkeypatch):
    from gclab.notebook import PAGE_WIDTH

    flags = ["--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
             "--xla_cpu_enable_fast_math=false"]
    monkeypatch.setenv("XLA_FLAGS", " ".join(flags))
    lines = str(hardware_report()).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("XLA flags"))
    assert [line.split()[-1] for line in lines[start:start + 3]] == flags
    assert all(len(line) <= PAGE_WIDTH for line in lines[start:])
    # Continued lines start where the value starts.
    assert {line.index("--") for line in lines[start:start + 3]} == {lines[0].index("cpu")}


def test_hardware_report_names_the_xla_flags_where_set(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", " --xla_cpu_use_fusion_emitters=false ")
    assert hardware_report()["XLA flags"] == "--xla_cpu_use_fusion_emitters=false"
    monkeypatch.setenv("XLA_FLAGS", "")
    assert "XLA flags" not in hardware_report()
    monkeypatch.delenv("XLA_FLAGS")
    assert "XLA flags" not in hardware_report()


def test_scale_defaults_to_cpu_here(monkeypatch):
    monkeypatch.delenv("GCLAB_SCALE", raising=False)
    assert choose_scale() == "cpu"


@pytest.mark.parametrize("value", SCALES)
def test_scale_can_be_forced(monkeypatch, value):
    monkeypatch.setenv("GCLAB_SCALE", value.upper())
    assert choose_scale() == value


def test_bad_scale_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("GCLAB_SCALE", "huge")
    with pytest.raises(ValueError, match="GCLAB_SCALE='huge' is invalid: one of cpu, 16GB, "
                                         "24GB, 40GB, 80GB, 141GB, gpu, big") as err:
        choose_scale()
    # In a notebook, IPython shows this one line instead of a traceback.
    assert err.value._render_traceback_() == [f"SettingError: {err.value}"]


@pytest.mark.parametrize("alias, name", [("gpu", "16GB"), ("BIG", "80GB"), ("80gb", "80GB")])
def test_scale_aliases_name_the_smallest_class_of_each_family(monkeypatch, alias, name):
    monkeypatch.setenv("GCLAB_SCALE", alias)
    scale = choose_scale()
    assert scale.name == name and repr(scale) == repr(name)


def test_scale_follows_usable_memory_not_the_printed_size():
    from gclab.devices import card_usable_bytes
    from gclab.notebook import scale_for

    assert scale_for(None) == "cpu"
    # JAX's pool on an 80 GB card is 0.75 of it: 60 GB is still the 80 GB class.
    assert scale_for(card_usable_bytes("H100")).name == "80GB"
    assert scale_for(card_usable_bytes("A100-80GB")) == "big"
    assert scale_for(card_usable_bytes("A100-40GB")).name == "40GB"
    assert scale_for(card_usable_bytes("L4")).name == "24GB"
    assert scale_for(card_usable_bytes("A10G")).name == "24GB"
    assert scale_for(card_usable_bytes("T4")).name == "16GB"
    assert scale_for(card_usable_bytes("H200")).name == "141GB"
    # A T4 whose driver reports a little less than 16 GB stays in its class.
    assert scale_for(int(0.97 * card_usable_bytes("T4"))).name == "16GB"
    assert scale_for(int(0.97 * card_usable_bytes("H100"))).name == "80GB"


def test_every_chapter_prints_its_scale_with_the_allowed_values():
    from gclab.notebook import scale_banner

    line = scale_banner(SCALE_TABLE["24GB"])
    assert line.startswith("This chapter runs at scale 24GB: usable ")
    assert "GCLAB_SCALE=cpu|16GB|24GB|40GB|80GB|141GB" in line
    assert max(map(len, line.splitlines())) <= 90 < len(line)  # wrapped for the page


def test_recorded_reads_json_with_hardware_and_date(tmp_path):
    assert recorded("absent", tmp_path) is None
    packaged = recorded("memory-cpu", tmp_path)  # not in tmp_path: the package's copy
    assert packaged["source"] == "gclab/recordings/memory-cpu.json"
    assert packaged["hardware"]["backend"] == "cpu" and packaged["date"].startswith("20")
    (tmp_path / "good.json").write_text(json.dumps({"hardware": "H100", "date": "2026-11-23",
                                                    "temp_bytes": 5}))
    assert recorded("good", tmp_path)["temp_bytes"] == 5
    (tmp_path / "anonymous.json").write_text(json.dumps({"temp_bytes": 5}))
    with pytest.raises(ValueError, match="hardware"):
        recorded("anonymous", tmp_path)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        recorded("broken", tmp_path)


def test_scale_is_a_frozen_config_that_compares_with_its_name(monkeypatch):
    monkeypatch.setenv("GCLAB_SCALE", "cpu")
    scale = choose_scale()
    assert scale == "cpu" and scale != "gpu" and repr(scale) == "'cpu'"
    assert isinstance(scale, Scale)
    assert (scale.compiled.resolution, scale.compiled.mesh_splits) == (4.0, 3)
    assert scale.live.latent_size <= scale.compiled.latent_size <= 128
    with pytest.raises(dataclasses.FrozenInstanceError):
        scale.name = "big"
    assert "4 deg / 3 splits" in str(scale) and str(scale).startswith("cpu: ")


def test_scales_grow_from_cpu_to_big():
    cpu, gpu, big = (SCALE_TABLE[name] for name in ("cpu", "16GB", "80GB"))
    assert [SCALE_TABLE[n].device_class.usable_bytes for n in SCALES[1:]] == sorted(
        SCALE_TABLE[n].device_class.usable_bytes for n in SCALES[1:])
    nodes = [s.compiled.num_grid_nodes for s in (cpu, gpu, big)]
    assert nodes == sorted(nodes) and nodes[0] < nodes[-1]
    assert (big.compiled.resolution, big.compiled.mesh_splits) == (0.25, 6)
    assert (gpu.compiled.resolution, gpu.compiled.latent_size) == (1.0, 512)
    for scale in (cpu, gpu, big):
        assert list(scale.geometries) == sorted(scale.geometries, reverse=True)


def test_glue_pastes_numpy_scalars_as_python_numbers(monkeypatch):
    import numpy as np

    import gclab.notebook as notebook

    pasted = {}
    monkeypatch.setattr(notebook, "myst_glue", lambda name, value, display: pasted.update(
        {name: (value, display)}))
    # None, so that a cell ending with a glue displays no stray value under its output
    assert notebook.glue("ratio", np.float64(0.25)) is None
    assert pasted["ratio"] == (0.25, False) and type(pasted["ratio"][0]) is float
    notebook.glue("count", np.int64(3))
    assert pasted["count"] == (3, False) and type(pasted["count"][0]) is int
    notebook.glue("label", "1.5 GiB")
    assert pasted["label"] == ("1.5 GiB", False)


def test_gpu_recordings_are_shown_with_hardware_date_and_ratio(tmp_path):
    from gclab.notebook import gpu_recording

    scale = SCALE_TABLE["80GB"]
    assert gpu_recording("03", SCALE_TABLE["40GB"], tmp_path) is None  # none recorded there
    record = {"hardware": {"device": "NVIDIA H100 80GB HBM3", "backend": "gpu", "jax": "0.10.2",
                           "commit": "0123456789abcdef"},
              "date": "2026-11-24T01:00:00+00:00", "part": "chapter-03", "scale": "80GB",
              "rows": [{"chapter": "03", "label": "lean", "plan_bytes": 10 * 2**30,
                        "peak_bytes": 11 * 2**30, "measured_over_plan": 1.1,
                        "step_seconds": 2.5, "status": "runs (plan 10.00 GiB)"},
                       {"chapter": "03", "label": "none", "plan_bytes": 300 * 2**30,
                        "status": "needs 300.00 GiB, does not fit this card"}]}
    (tmp_path / "gpu-80GB-chapter-03.json").write_text(json.dumps(record))
    title, table = gpu_recording("03", scale, tmp_path)
    assert title.startswith("recorded on NVIDIA H100 80GB HBM3 (gpu), 2026-11-24")
    assert "commit 0123456789ab" in title
    assert list(table["configuration"]) == ["lean", "none"]
    assert table["measured peak"][0] == "11.00 GiB" and table["measured / plan"][0] == "1.10"
    assert table["step time"][0] == "2.500 s"
    # Nothing measured: "n/a" in every measured column, never a NaN on the page.
    assert (table.loc[1, ["measured peak", "measured / plan", "step time"]] == "n/a").all()
    assert "does not fit" in table["on the card"][1]
    assert "2026-11-24 01:00 UTC" in title  # the recording's ISO date, to the minute


@pytest.mark.parametrize("date, shown", [("2026-11-28T03:54:13+02:00", "2026-11-28 01:54 UTC"),
                                         ("2026-11-28", "2026-11-28"),  # no zone to convert
                                         ("last Tuesday", "last Tuesday")])
def test_a_gpu_recording_s_date_is_shown_in_utc_and_any_other_as_written(tmp_path, date, shown):
    from gclab.notebook import gpu_recording

    record = {"hardware": {"device": "card", "backend": "gpu", "jax": "0.11.2", "commit": "0"},
              "date": date, "scale": "80GB",
              "rows": [{"chapter": "03", "label": "lean", "plan_bytes": 2**30}]}
    (tmp_path / "gpu-80GB-chapter-03.json").write_text(json.dumps(record))
    title, _ = gpu_recording("03", SCALE_TABLE["80GB"], tmp_path)
    assert title.startswith(f"recorded on card (gpu), {shown}, jax 0.11.2"), title


def test_a_gpu_recording_of_another_scale_is_shown_only_when_asked_and_named(tmp_path):
    """A reader on a CPU sees what a card recorded, marked as another scale's; the
    largest scale recorded wins, and the raw rows are this chapter's only."""
    from gclab.notebook import gpu_record, gpu_recording

    def write(scale, device, label):
        record = {"hardware": {"device": device, "backend": "gpu", "jax": "0.11.2",
                               "commit": "0123456789abcdef"},
                  "date": "2026-11-28T01:54:13+00:00", "part": "chapters-01-05-07",
                  "scale": scale,
                  "rows": [{"chapter": "05", "label": label, "plan_bytes": 2**30,
                            "peak_bytes": 2**30, "status": "runs (plan 1.00 GiB)"},
                           {"chapter": "01", "label": "forward pass", "plan_bytes": 2**30,
                            "status": "runs (plan 1.00 GiB)"}]}
        (tmp_path / f"gpu-{scale}-chapters-01-05-07.json").write_text(json.dumps(record))

    write("16GB", "Tesla T4", "small card")
    write("80GB", "NVIDIA H100 80GB HBM3", "big card")
    cpu = SCALE_TABLE["cpu"]
    assert gpu_recording("05", cpu, tmp_path) is None
    title, table = gpu_recording("05", cpu, tmp_path, other_scales=True)
    assert title.startswith("at scale 80GB, not this chapter's cpu: recorded on NVIDIA H100")
    assert list(table["configuration"]) == ["big card"]
    record = gpu_record("05", SCALE_TABLE["16GB"], tmp_path, other_scales=True)
    assert record["scale"] == "16GB" and [r["label"] for r in record["rows"]] == ["small card"]
    title, _ = gpu_recording("05", SCALE_TABLE["16GB"], tmp_path, other_scales=True)
    assert title.startswith("recorded on Tesla T4")
    assert gpu_record("02", cpu, tmp_path, other_scales=True) is None  # no part records 02


def test_a_cut_short_recording_without_this_chapter_gives_way_and_unmeasured_rows_say_why(
        tmp_path):
    """A 141GB run stopped after chapter 1's row holds nothing of chapter 5: the 80GB
    recording is shown instead (an empty table had no columns, and the chapter's
    `set_index` raised); a step that fits but was not run says why, not 'runs'."""
    from gclab.notebook import gpu_recording

    def write(scale, rows, complete):
        record = {"hardware": {"device": f"card {scale}", "backend": "gpu", "jax": "0.11.2",
                               "commit": "0123456789abcdef"},
                  "date": "2026-11-28T01:54:13+00:00", "scale": scale, "rows": rows,
                  "complete": complete}
        (tmp_path / f"gpu-{scale}-chapters-01-05-07.json").write_text(json.dumps(record))

    write("141GB", [{"chapter": "01", "label": "forward pass", "plan_bytes": 2**30,
                     "fits": True, "status": "runs (plan 1.00 GiB)"}], False)
    write("80GB", [{"chapter": "05", "label": "live model f32", "plan_bytes": 2**30,
                    "fits": True, "status": "runs (plan 1.00 GiB)", "peak_bytes": None,
                    "measure_status": "not measured",
                    "measure_message": "not measured: this process holds 59.38 GiB of the "
                    "gpu device's memory, leaving 19.79 GiB, too little for the plan "
                    "(38.91 GiB); measure from a fresh process"}], True)
    title, table = gpu_recording("05", SCALE_TABLE["cpu"], tmp_path, other_scales=True)
    assert title.startswith("at scale 80GB, not this chapter's cpu: recorded on card 80GB")
    assert table["on the card"][0] == ("not measured: this process holds 59.38 GiB of the gpu "
                                       "device's memory, leaving 19.79 GiB, too little for the "
                                       "plan (38.91 GiB)")
    assert gpu_recording("05", SCALE_TABLE["141GB"], tmp_path) is None


def test_a_recorded_plan_xla_shrank_says_so(tmp_path):
    from gclab.notebook import gpu_recording

    record = {"hardware": {"device": "card", "backend": "gpu", "jax": "0.11.2",
                           "commit": "0123456789abcdef"},
              "date": "2026-11-28T01:54:13+00:00", "scale": "80GB",
              "rows": [{"chapter": "03", "label": "none", "plan_bytes": 236 * 2**30,
                        "fits": False, "status": "needs 236.00 GiB, does not fit this card",
                        "xla_remat": {"from_bytes": 256 * 2**30, "limit_bytes": 55 * 2**30,
                                      "reduced_to_bytes": 235 * 2**30}}]}
    (tmp_path / "gpu-80GB-chapter-03.json").write_text(json.dumps(record))
    _, table = gpu_recording("03", SCALE_TABLE["80GB"], tmp_path)
    assert table["on the card"][0] == (
        "needs 236.00 GiB, does not fit this card (XLA:GPU's remat pass shrank it from "
        "256.00 GiB while compiling, short of the card)")


def test_compare_times_names_a_winner_only_beyond_the_spread():
    from gclab.notebook import compare_times, time_table

    samples = {"f32": [1.0, 1.1, 1.2], "bf16": [1.5, 1.6, 1.8], "noisy": [0.9, 1.15, 1.6]}
    slower = compare_times(samples, "bf16", "f32")
    assert slower.verdict == "slower than" and slower.distinct
    assert slower.ratio == pytest.approx(1.6 / 1.1)
    assert slower.spread == pytest.approx(0.3 / 1.6)  # bf16's range is the wider one
    assert compare_times(samples, "f32", "bf16").verdict == "faster than"
    # Overlapping ranges: a tie, whatever the medians say.
    tie = compare_times(samples, "noisy", "f32")
    assert tie.verdict == "within the run-to-run spread of" and not tie.distinct
    assert tie.ratio == pytest.approx(1.15 / 1.1)
    table = time_table(samples)
    assert list(table.index) == ["f32", "bf16", "noisy"]
    assert table.loc["noisy", "fastest_seconds"] == 0.9
    assert table.loc["noisy", "slowest_seconds"] == 1.6
    assert table.loc["f32", "spread"] == pytest.approx(0.2 / 1.1)
    assert table.loc["bf16", "runs"] == 3


@pytest.mark.parametrize("samples, message", [
    ({"a": [1.0, 2.0]}, "no timings named 'b'"),
    ({"a": [1.0, 2.0], "b": [1.0]}, "'b' needs two or more positive timings"),
    ({"a": [1.0, 2.0], "b": [1.0, -1.0]}, "'b' needs two or more positive timings"),
])
def test_compare_times_refuses_what_it_cannot_judge(samples, message):
    from gclab.notebook import compare_times

    with pytest.raises(ValueError, match=message):
        compare_times(samples, "a", "b")


@pytest.mark.parametrize("samples, message", [
    ({}, "time_table: samples={} is invalid"),  # a KeyError of pandas before
    ({"a": []}, "'a' needs one or more positive timings"),  # a StatisticsError
    ({"a": [-1.0, 1.0]}, "'a' needs one or more positive timings"),  # a ZeroDivisionError
    ({"a": [float("nan")]}, "'a' needs one or more positive timings"),
])
def test_time_table_refuses_what_it_cannot_summarise(samples, message):
    from gclab.notebook import time_table

    with pytest.raises(ValueError, match=re.escape(message)):
        time_table(samples)


def test_guarded_grid_names_a_step_spec_given_for_a_live_config():
    from gclab.notebook import guarded_grid
    from gclab.sizing import StepSpec

    spec = StepSpec(get_preset("cpu-4x32").model, get_preset("cpu-4x32").task)
    with pytest.raises(TypeError, match="configs are LiveConfigs .* not StepSpec"):
        guarded_grid([spec], usable=2**30)


def test_planned_and_measured_table_formats_bytes_and_says_once_why_a_peak_is_missing():
    import pandas as pd

    from gclab.notebook import planned_and_measured_table

    beside = pd.DataFrame({
        "configuration": ["f32", "bf16", "huge"],
        "plan_bytes": [2 * 2**30, 2**30, 90 * 2**30], "temp_bytes": [2**30, 2**29, 80 * 2**30],
        "measured_peak_bytes": [None, 1.5 * 2**30, None],
        "measured_over_plan": [None, 1.5, None],
        "measured": ["run failed (error): boom", "1.50 GiB", "run failed (error): boom"],
    }).set_index("configuration")
    table, notes = planned_and_measured_table(beside)
    assert list(table.columns) == ["XLA plan", "of which temp", "measured peak",
                                   "measured / plan"]
    assert table.loc["f32", "XLA plan"] == "2.00 GiB"
    assert table.loc["f32", "of which temp"] == "1.00 GiB"
    assert table.loc["bf16", "measured peak"] == "1.50 GiB"
    assert table.loc["bf16", "measured / plan"] == "1.50"
    assert table.loc["huge", "measured peak"] == "n/a" == table.loc["huge", "measured / plan"]
    assert notes == ["run failed (error): boom"]
    assert planned_and_measured_table(beside.loc[["bf16"]])[1] == []


def test_page_text_wraps_each_long_line_and_keeps_short_ones():
    from gclab.notebook import PAGE_WIDTH, page_text

    long = "word " * 40
    text = page_text(f"short line\n{long.strip()}\n\nlast")
    lines = text.splitlines()
    assert lines[0] == "short line" and lines[-1] == "last" and "" in lines
    assert max(map(len, lines)) <= PAGE_WIDTH
    assert all(line.startswith("  word") for line in lines[2:-2])  # continuations
    assert text.replace("\n  ", " ").split() == f"short line {long} last".split()
    assert page_text("x" * 100, 30) == "x" * 100  # a word is never split
    with pytest.raises(ValueError, match="width=5 is invalid"):
        page_text("a", 5)


def test_precision_by_backend_pairs_each_recipe_per_recorded_backend(tmp_path):
    from gclab.notebook import precision_by_backend

    def record(backend, device, rows):
        return {"hardware": {"backend": backend, "device": device, "cpu_count": 2,
                             "jax": "0.10.2", "date": "2026-11-26T02:00:00+00:00"},
                "recipes": [{"preset": p, "precision": q, "recipe": r, "temp_bytes": t, **x}
                            for p, q, r, t, x in rows]}

    (tmp_path / "memory-cpu.json").write_text(json.dumps(record("cpu", "cpu", [
        ("graphcast", "f32", "none", 400, {}), ("graphcast", "bf16", "none", 300, {}),
        ("graphcast", "f32", "lean", 100, {})])))  # lean has no bf16 row: left out
    (tmp_path / "memory-gpu.json").write_text(json.dumps(record("gpu", "NVIDIA H200", [
        ("graphcast", "f32", "none", 400, {"xla_remat": {"limit_bytes": 1}}),
        ("graphcast", "bf16", "none", 100, {})])))
    sources, table = precision_by_backend(("memory-cpu", "memory-gpu", "memory-tpu"), tmp_path)
    assert sources == ["XLA:CPU: cpu (2 cores), jax 0.10.2, 2026-11-26 (memory-cpu)",
                       "XLA:GPU: NVIDIA H200, jax 0.10.2, 2026-11-26 (memory-gpu)"]
    assert table.to_dict("records") == [
        {"backend": "XLA:CPU", "device": "cpu", "preset": "graphcast", "recipe": "none",
         "f32 temp": 400, "bf16 temp": 300, "bf16 / f32": 0.75, "XLA remat": False},
        {"backend": "XLA:GPU", "device": "NVIDIA H200", "preset": "graphcast",
         "recipe": "none", "f32 temp": 400, "bf16 temp": 100, "bf16 / f32": 0.25,
         "XLA remat": True}]


def test_the_shipped_records_give_both_backends_at_the_published_sizes():
    from gclab.notebook import precision_by_backend

    sources, table = precision_by_backend()
    assert sources[0].startswith("XLA:CPU: cpu") and sources[1].startswith("XLA:GPU: NVIDIA")
    published = table[table.preset.isin(["graphcast-small", "graphcast"])]
    for backend in ("XLA:CPU", "XLA:GPU"):
        rows = published[published.backend == backend]
        assert len(rows) == 8 and ((rows["bf16 / f32"] > 0) & (rows["bf16 / f32"] < 1)).all()


def test_claim_figures_paste_a_recording_and_say_n_a_without_one():
    import math

    from gclab.notebook import claim_figures

    record = {"hardware": {"device": "NVIDIA H200"},
              "authors_claim": {"rows": [{"step": "deepmind", "total_bytes": 3 * 2**30,
                                          "fits_tpu_v4": False},
                                         {"step": "lean", "total_bytes": 2**30},
                                         {"step": "memory-first-schedule",
                                          "total_bytes": 2 * 2**30, "fits_tpu_v4": True}],
                                "peak": {"peak_bytes": 4 * 2**30, "float32_bytes": 2**30,
                                         "grid_sized_buffers": 3,
                                         "grid_sized_bytes": 2 * 2**30,
                                         "stage": "backward: decoder"}},
              "claim_live": {"peak_bytes": 5 * 2**30, "measured_over_plan": 1.25,
                             "step_seconds": 0.5}}
    got = claim_figures(record)
    assert got == {"device": "NVIDIA H200", "deepmind_total": "3.00 GiB",
                   "haiku_total": "n/a", "streamed_total": "n/a", "lean_total": "1.00 GiB",
                   "peak": "4.00 GiB", "peak_f32": "25%", "grid_buffers": 3,
                   "grid_bytes": "2.00 GiB", "live_peak": "5.00 GiB", "live_ratio": 1.25,
                   "live_step": 0.5, "deepmind_fits": "over 32 GiB", "streamed_fits": "n/a",
                   "scheduled_total": "2.00 GiB", "scheduled_fits": "within 32 GiB",
                   "peak_stage": "backward: decoder"}
    empty = claim_figures(None)
    assert set(empty) == set(got) and empty["deepmind_total"] == "n/a"
    assert math.isnan(empty["grid_buffers"]) and math.isnan(empty["live_step"])


@pytest.mark.parametrize("width,words", [
    (True, "width=True is invalid: an integer >= 20"),
    (30.0, "width=30.0 is invalid: an integer >= 20"),
    (np.int64(19), "width=np.int64(19) is invalid: an integer >= 20"),
], ids=repr)
def test_page_text_width_is_an_integer_not_a_bool_or_float(width, words):
    from gclab.notebook import page_text

    with pytest.raises(ValueError) as e:
        page_text("a", width)
    assert str(e.value) == words
    assert page_text("a b c", np.int64(20)) == "a b c"


def test_live_configs_names_a_scale_given_by_its_name():
    from gclab.notebook import live_configs

    for chapter in ("06", "07"):  # 07 at a small scale runs nothing: not an empty list
        with pytest.raises(TypeError, match=r"^live_configs scale='cpu' is invalid: a Scale "
                           r"\(choose_scale\(\) or SCALE_TABLE\[name\]"):
            live_configs(chapter, "cpu")
    assert live_configs("07", SCALE_TABLE["cpu"]) == []


@pytest.mark.parametrize("usable,error", [("8GiB", TypeError), (True, TypeError),
                                          (0, ValueError), (-1.0, ValueError),
                                          (0.5, ValueError),  # would be 0 bytes
                                          (float("inf"), ValueError)], ids=repr)
def test_usable_bytes_are_a_positive_number(usable, error):
    from gclab.config import TaskConfig
    from gclab.notebook import guarded_grid, planned_and_measured, run_if_fits
    from gclab.sizing import StepSpec

    spec = StepSpec(SCALE_TABLE["cpu"].live, TaskConfig.from_levels(13))
    for name, call in (("run_if_fits", lambda: run_if_fits(spec, usable=usable)),
                       ("guarded_grid", lambda: guarded_grid([], usable=usable)),
                       ("planned_and_measured",
                        lambda: planned_and_measured({"x": spec}, usable=usable))):
        with pytest.raises(error) as e:
            call()
        assert str(e.value).startswith(f"{name} usable={usable!r} is invalid: a finite "
                                       "number of bytes >= 1"), str(e.value)


def test_usable_memory_on_a_cpu_is_at_most_the_hosts(monkeypatch):
    import gclab.limits
    from gclab import devices, notebook

    # A host (or a cgroup limit) below the cpu class's figure: that is what can be held.
    monkeypatch.setattr(gclab.limits, "host_memory_bytes", lambda: 2**30)
    assert notebook.usable_here() == 2**30
    assert notebook._host_memory() == 2**30  # the hardware report's figure, cgroup included
    monkeypatch.setattr(gclab.limits, "host_memory_bytes", lambda: 64 * 2**30)
    assert notebook.usable_here() == devices.CPU_USABLE_BYTES
    monkeypatch.setattr(gclab.limits, "host_memory_bytes", lambda: None)  # unknown
    assert notebook.usable_here() == devices.CPU_USABLE_BYTES


def _smallest_live_spec():
    from gclab.notebook import live_configs

    return live_configs("06", SCALE_TABLE["cpu"])[0].spec  # 4 x 32, cheap to compile


def test_run_if_fits_shows_a_plan_the_host_cannot_hold_instead_of_raising(monkeypatch):
    import gclab.sizing.step as step_module
    from gclab.devices import FIT_MARGIN
    from gclab.notebook import run_if_fits

    # Usable memory the class allows, a host that holds almost nothing: compiled, not run.
    monkeypatch.setattr(step_module, "host_memory_bytes", lambda: 2**20)
    run = run_if_fits(_smallest_live_spec(), "small", usable=2**40)
    assert not run.fits and not run.ran and run.step.run is None
    assert run.usable_bytes == 2**20 and run.plan_bytes > 2**20
    assert run.status().startswith("needs ")
    assert run.status().endswith(f"does not fit this card (usable 1.00 MiB, plans up to "
                                 f"{FIT_MARGIN:.0%} of it)")


def test_run_if_fits_shows_a_plan_refused_after_compiling_as_not_fitting(monkeypatch):
    import gclab.sizing.step as step_module
    from gclab.notebook import run_if_fits

    # The device's memory reads less when the step would run than when it was checked.
    readings = iter([2**40, 2**20])
    monkeypatch.setattr(step_module, "device_memory_bytes", lambda: next(readings))
    run = run_if_fits(_smallest_live_spec(), "small", usable=2**40)
    assert not run.fits and not run.ran and run.step.memory.total_bytes == run.plan_bytes > 0


def test_run_if_fits_shows_a_step_too_large_to_plan_by_its_estimate(monkeypatch):
    import gclab.sizing.step as step_module
    from gclab.limits import TooLarge
    from gclab.notebook import run_if_fits
    from gclab.sizing import estimate_step_bytes

    def refuse(spec, graphs=None):
        raise TooLarge("one training step needs about 2 EiB; refused before starting")

    monkeypatch.setattr(step_module, "check_step_size", refuse)
    spec = _smallest_live_spec()
    run = run_if_fits(spec, "huge", usable=2**30)
    assert (run.label, run.fits, run.ran, run.step) == ("huge", False, False, None)
    assert run.plan_bytes == estimate_step_bytes(spec) and run.temp_bytes == 0


def test_run_if_fits_reports_graphs_too_large_to_build_once(monkeypatch):
    # Guards against a graph-build refusal taken for the step's own and the graphs built
    # again while handling it (two chained tracebacks of the same refusal).
    import gclab.geometry.graphs as graphs_module
    from gclab.config import ModelConfig, TaskConfig
    from gclab.limits import TooLarge
    from gclab.notebook import run_if_fits
    from gclab.sizing import StepSpec

    monkeypatch.setattr(graphs_module, "host_memory_bytes", lambda: 4 * 2**30)
    spec = StepSpec(ModelConfig(resolution=0.1, mesh_splits=6), TaskConfig.from_levels(13))
    with pytest.raises(TooLarge, match="^building the graphs of a 0.1 deg grid") as e:
        run_if_fits(spec, "0.1 deg", usable=80 * 10**9)
    assert e.value.__context__ is None


def test_guarded_grid_runs_every_config_of_a_generator(monkeypatch):
    from gclab import notebook

    configs = notebook.live_configs("06", SCALE_TABLE["cpu"])[:2]
    guarded = []

    def run_if_fits(spec, label, usable):
        guarded.append(label)
        return notebook.GuardedRun(label, 3 * 2**20, 2**20, usable, False)

    monkeypatch.setattr(notebook, "run_if_fits", run_if_fits)
    df = notebook.guarded_grid((c for c in configs), usable=2**30)
    assert guarded == df.label.tolist() == [c.label for c in configs]
    assert df.status.tolist() == ["oom", "oom"]
    with pytest.raises(TypeError, match="configs are LiveConfigs .* not an int$"):
        notebook.guarded_grid(3, usable=2**30)


def test_timings_may_be_numpy_numbers():
    from gclab.notebook import compare_times, time_table

    samples = {"a": [np.float32(1.0), np.float32(1.2)], "b": [np.int64(2), np.int64(3)]}
    table = time_table(samples)
    assert table.loc["b", "median_seconds"] == 2.5 and table.loc["a", "runs"] == 2
    assert compare_times(samples, "a", "b").verdict == "faster than"
    with pytest.raises(ValueError, match="'a' needs one or more positive timings"):
        time_table({"a": [np.float64(-1.0)]})


def _tiny_spec():
    from gclab.config import ModelConfig, TaskConfig
    from gclab.sizing import StepSpec

    return StepSpec(ModelConfig(resolution=6, mesh_splits=2, latent_size=16, processor_steps=2),
                    TaskConfig.from_levels(13))


def test_run_if_fits_names_a_spec_that_is_no_step_spec():
    from gclab.notebook import LiveConfig, run_if_fits

    spec = _tiny_spec()
    for wrong, kind in ((LiveConfig("01", "x", spec), "a LiveConfig"), (None, "None"),
                        (spec.model, "a ModelConfig")):
        with pytest.raises(TypeError, match=r"^run_if_fits spec(=None)? is invalid: a StepSpec "
                           rf"\(a LiveConfig's \.spec\), not {kind}$"):
            run_if_fits(wrong, usable=2**30)


@pytest.mark.parametrize("given, kind", [(1.0, "a float"), (None, "None"), ("1.0", "a str")])
def test_timings_that_are_no_list_are_named_in_one_line(given, kind):
    from gclab.notebook import compare_times, time_table

    words = f"'a' needs a list of timings (seconds), got {kind}"
    with pytest.raises(ValueError, match=re.escape(f"time_table: {words}")):
        time_table({"a": given})
    with pytest.raises(ValueError, match=re.escape(f"compare_times: {words}")):
        compare_times({"a": given, "b": [1, 2]}, "a", "b")


def test_timings_may_come_from_generators():
    from gclab.notebook import compare_times, time_table

    table = time_table({"a": (t for t in [1.0, 2.0, 3.0])})
    assert table.loc["a", "median_seconds"] == 2.0 and table.loc["a", "runs"] == 3
    same = iter([1.0, 1.5])  # the same generator on both sides: read once
    assert compare_times({"a": same}, "a", "a").verdict == "within the run-to-run spread of"
    faster = compare_times({"a": iter([1.0, 1.1]), "b": (t for t in [2.0, 2.5])}, "a", "b")
    assert faster.verdict == "faster than" and faster.ratio == pytest.approx(1.05 / 2.25)


@pytest.mark.parametrize("call", ["gpu_record", "gpu_recording"])
def test_gpu_recordings_name_a_scale_given_by_its_name(call, tmp_path):
    from gclab import notebook

    with pytest.raises(TypeError, match=rf"^{call} scale='16GB' is invalid: a Scale "
                       r"\(choose_scale\(\) or SCALE_TABLE\[name\], name one of cpu, 16GB"):
        getattr(notebook, call)("03", "16GB", tmp_path)


@pytest.mark.parametrize("name, error, words", [
    (None, TypeError, "scale_named name=None is invalid: a str, one of cpu, 16GB"),
    (16, TypeError, "scale_named name=16 is invalid: a str, one of cpu, 16GB"),
    ("huge", ValueError, "scale_named name='huge' is invalid: one of cpu, 16GB"),
], ids=repr)
def test_scale_named_names_its_argument_not_the_environment(name, error, words):
    from gclab.notebook import scale_named

    with pytest.raises(error) as e:
        scale_named(name)
    assert str(e.value).startswith(words) and "GCLAB_SCALE" not in str(e.value)
    assert scale_named(" 16gb ") == "16GB"


def test_a_bad_memory_fraction_is_a_setting_error_shown_in_one_line(monkeypatch):
    from gclab import config, devices, notebook

    assert notebook.SettingError is config.SettingError
    monkeypatch.delenv(devices.DEPRECATED_MEM_FRACTION_ENV, raising=False)
    monkeypatch.setenv(devices.MEM_FRACTION_ENV, "75%")
    with pytest.raises(notebook.SettingError) as e:
        devices.card_usable_bytes("T4")
    assert e.value._render_traceback_() == [
        "SettingError: XLA_CLIENT_MEM_FRACTION='75%' is invalid: a number in (0, 1]"]
    monkeypatch.setenv(devices.DEPRECATED_MEM_FRACTION_ENV, "0.5")  # both names set
    with pytest.raises(notebook.SettingError, match="are both set"):
        devices.mem_fraction()


@pytest.mark.parametrize("width, error", [("x", TypeError), (10, ValueError),
                                          (30.0, TypeError)], ids=repr)
def test_scale_banner_width_is_an_integer_as_for_page_text(width, error):
    from gclab.notebook import scale_banner

    with pytest.raises(error, match=rf"^scale_banner width={width!r} is invalid: an integer "
                       ">= 20$"):
        scale_banner(SCALE_TABLE["cpu"], width)
    assert all(len(line) <= 20 for line in scale_banner(SCALE_TABLE["cpu"], 20).splitlines()
               if "|" not in line)  # the allowed values are never split


@pytest.mark.parametrize("plans, words", [
    ({"a": 5}, "planned_and_measured plans['a']=5 is invalid: a pair of numbers "
               "(plan_bytes, temp_bytes)"),
    ({"a": (1, 2, 3)}, "plans['a']=(1, 2, 3) is invalid: a pair of numbers"),
    ({"a": ("1", 2)}, "plans['a']=('1', 2) is invalid: a pair of numbers"),
    ([("a", (1, 2))], "planned_and_measured plans is a list: it must be a "
                      "{label: (plan_bytes, temp_bytes)} mapping"),
], ids=repr)
def test_planned_and_measured_names_plans_that_are_no_pairs_by_label(plans, words):
    from gclab.notebook import planned_and_measured

    with pytest.raises(TypeError, match=re.escape(words)):
        planned_and_measured({"a": _tiny_spec()}, plans=plans)


def test_guarded_grid_refuses_no_configs_and_names_itself_for_repeats():
    from gclab.notebook import guarded_grid

    with pytest.raises(ValueError, match="^guarded_grid configs is empty: nothing to run$"):
        guarded_grid([], usable=2**30)
    with pytest.raises(ValueError, match=r"^guarded_grid repeats=0 is invalid: an integer >= 1$"):
        guarded_grid([], repeats=0)
