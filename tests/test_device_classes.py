"""Every chapter fits every device class: what it runs live has a plan within usable memory.

Without executing the notebooks: for each chapter and each device class, the configurations
the chapter runs on the device (`gclab.notebook.live_configs`) are compiled from shapes on
XLA:CPU, and each compiled total (arguments + outputs + temp - aliased) must be within the
class's budget (`DeviceClass.budget_bytes`: `FIT_MARGIN` of the smallest usable memory of
the class). Configurations a chapter runs through `run_if_fits` (guarded) may exceed it;
they are shown as plans, and at least one of them must fit so that the chapter still has
something to run. A chapter that would run out of memory on a T4 fails here.

Cost on two cores: of the configurations a chapter guards, only as many are compiled as it
takes to find one that fits, smallest first; compiles are cached per configuration across
classes (the 16, 24 and 40 GB classes share most of theirs, and the tests of chapter 3 at the
16 GB class those of the parametrised cases), in one process: the module's tests share one xdist
worker (`xdist_group`, with `--dist loadgroup`), so no configuration is compiled twice.
Chapter 6's grid runs at the live model's geometry, every cell guarded
(`gclab.notebook.guarded_grid`): it is checked through its smallest cell, which must fit so
that the chapter has something to time, and its largest (every other cell has fewer steps or
a smaller latent on the same geometry, so less memory; the ``cpu`` class checks that order on
its whole grid), whose plan decides whether the table shows cells that do not fit. That
the guard shows such cells as plans and never runs them is checked on a cheap grid.
The 0.25 deg bfloat16 step of chapter 7 takes minutes to compile on
XLA:CPU, so it is read from the recorded compiled figures shipped with gclab
(`gclab/recordings/memory-cpu.json`), where the same step is recorded.
"""

from __future__ import annotations

import functools

import pytest

from gclab.config import get_preset
from gclab.devices import DEVICE_CLASSES, FIT_MARGIN
from gclab.memory import get_recipe
from gclab.notebook import SCALE_TABLE, SCALES, guarded_grid, live_configs, run_if_fits
from gclab.recordings import recorded
from gclab.sizing import StepSpec, estimate_step_bytes, train_step_memory

pytestmark = pytest.mark.xdist_group("device-classes")

CHAPTERS = ("01", "02", "03", "04", "05", "06", "07", "08")


def _recorded_total(spec: StepSpec) -> int | None:
    """The recorded XLA:CPU total of exactly this step, if gclab ships one."""
    record = recorded("memory-cpu")
    for row in record["recipes"]:
        preset = get_preset(row["preset"])
        if (StepSpec(preset.model, preset.task, get_recipe(row["recipe"], row["precision"]))
                == spec):
            return int(row["total_bytes"])
    return None


@functools.lru_cache(maxsize=None)
def plan_bytes(spec: StepSpec) -> int:
    """XLA:CPU's compiled total of one training step (recorded for 0.25 deg bfloat16)."""
    if spec.model.resolution < 1 and spec.memory.precision == "bf16":
        total = _recorded_total(spec)
        assert total is not None, f"no recorded plan for {spec.title()}"
        return total
    return int(train_step_memory(spec).total_bytes)


def _corners(configs: list) -> list:
    """Chapter 6's smallest and largest cell (by steps, then latent)."""
    def size(c):
        return c.spec.model.processor_steps, c.spec.model.latent_size

    return [min(configs, key=size), max(configs, key=size)]


def _checked(chapter: str, configs: list) -> list:
    """The configurations to compile: chapter 6's grid by its smallest and largest cell."""
    if chapter != "06" or not configs:
        return configs
    return _corners(configs)


@pytest.mark.parametrize("name", SCALES)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_what_a_chapter_runs_fits_every_device_class(chapter, name):
    scale, cls = SCALE_TABLE[name], DEVICE_CLASSES[name]
    configs = live_configs(chapter, scale)
    if chapter == "07" and scale != "big":
        assert configs == []  # compiled from shapes only at this scale
        return
    assert configs, f"chapter {chapter} runs nothing at {name}"
    checked = _checked(chapter, configs)
    for config in (c for c in checked if not c.guarded):
        total = plan_bytes(config.spec)
        assert total <= cls.budget_bytes, (
            f"chapter {chapter} at {name} runs {config.label!r}: plan {total / 2**30:.2f} GiB > "
            f"{cls.budget_bytes / 2**30:.2f} GiB ({FIT_MARGIN:.0%} of usable)")
    # One guarded configuration that fits is enough: they are compiled smallest (by the
    # counting model's estimate) first, and the rest only while none fits.
    guarded = sorted((c for c in checked if c.guarded), key=lambda c: estimate_step_bytes(c.spec))
    if guarded:
        assert any(plan_bytes(c.spec) <= cls.budget_bytes for c in guarded), (
            f"chapter {chapter} at {name}: no guarded configuration fits: "
            f"{ {c.label: plan_bytes(c.spec) for c in guarded} }")


def test_chapter_3_at_the_16gb_class_runs_lean_and_shows_the_plan_of_the_rest():
    cls = DEVICE_CLASSES["16GB"]
    configs = {c.label: c for c in live_configs("03", SCALE_TABLE["16GB"]) if c.guarded}
    fits = {label: plan_bytes(c.spec) <= cls.budget_bytes for label, c in configs.items()}
    assert fits == {"none": False, "step": False, "+ edge blocks (deepmind)": False,
                    "lean": True}


#: Whether chapter 6's largest cell (16 x 512, no technique) fits, per class: at 2 deg it
#: needs about 11.3 GiB, over the 16 GB class's budget (so a T4 shows it as a plan), under
#: the 24 and 40 GB classes'; at 1 deg (80 GB and up) about 43.5 GiB, under theirs.
LARGEST_CELL_FITS = {"cpu": True, "16GB": False, "24GB": True, "40GB": True, "80GB": True,
                     "141GB": True}


@pytest.mark.parametrize("name", SCALES)
def test_chapter_6_grid_is_guarded_at_the_live_geometry_and_runs_its_smallest_cell(name):
    scale, cls = SCALE_TABLE[name], DEVICE_CLASSES[name]
    configs = live_configs("06", scale)
    assert configs and all(c.guarded for c in configs)
    assert {(c.spec.model.resolution, c.spec.model.mesh_splits) for c in configs} == {
        (scale.live.resolution, scale.live.mesh_splits)}
    assert len(configs) == (6 if scale == "cpu" else 20)
    smallest, largest = _corners(configs)
    assert plan_bytes(smallest.spec) <= cls.budget_bytes, f"{name}: nothing to time"
    assert (plan_bytes(largest.spec) <= cls.budget_bytes) == LARGEST_CELL_FITS[name], (
        f"{name}: 16 x 512 plan {plan_bytes(largest.spec) / 2**30:.2f} GiB, budget "
        f"{cls.budget_bytes / 2**30:.2f} GiB")


def test_the_guarded_grid_shows_cells_that_do_not_fit_and_never_runs_them(monkeypatch):
    import gclab.measure.timing as timing

    configs = live_configs("06", SCALE_TABLE["cpu"])[:2]  # 4 x 32 and 4 x 128, cheap
    small, large = (plan_bytes(c.spec) for c in configs)
    assert small < large
    usable = int((small + large) / 2 / FIT_MARGIN)  # room for the small cell only
    timed = []
    real = timing.median_seconds
    monkeypatch.setattr(timing, "median_seconds",
                        lambda fn, *args, **kwargs: timed.append(fn)
                        or real(fn, *args, **kwargs))
    df = guarded_grid(configs, usable=usable).set_index("label")
    assert len(timed) == 1  # only the cell that fits ran
    assert df.fits.tolist() == [True, False] and df.status.tolist() == ["ok", "oom"]
    assert df.total_bytes.tolist() == [small, large]
    assert df.step_seconds["4 x 32"] > 0 and df.step_seconds.isna()["4 x 128"]
    assert df.on_card["4 x 32"] == "ran"
    assert df.on_card["4 x 128"].startswith("needs ")
    assert df.on_card["4 x 128"].endswith("does not fit this card")


def test_the_cpu_grid_of_chapter_6_grows_with_steps_and_latent():
    configs = live_configs("06", SCALE_TABLE["cpu"])
    totals = {(c.spec.model.processor_steps, c.spec.model.latent_size): plan_bytes(c.spec)
              for c in configs}
    largest = max(totals)
    assert all(t <= totals[largest] for t in totals.values())
    for (s, latent), t in totals.items():
        for (s2, latent2), t2 in totals.items():
            if s <= s2 and latent <= latent2:
                assert t <= t2


def test_a_guarded_run_that_does_not_fit_allocates_nothing_and_says_so():
    spec = live_configs("03", SCALE_TABLE["cpu"])[-1].spec  # the live model, no remat
    total = plan_bytes(spec)
    small = run_if_fits(spec, "live", usable=int(total))  # the margin does not fit
    assert not small.fits and not small.ran and small.plan_bytes == total
    assert small.status().startswith("needs ") and "does not fit this card" in small.status()
    roomy = run_if_fits(spec, "live", usable=int(2 * total))
    assert roomy.fits and roomy.ran and roomy.status().startswith("runs (plan ")
    roomy.step.run()  # one real step
    assert roomy.measured_peak_bytes is None and roomy.measured_over_plan is None  # CPU
