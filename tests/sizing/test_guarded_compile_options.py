"""A guarded live compile on a GPU leaves XLA's rematerialization pass out.

On an H100 the pass shrank the 0.25 deg `none` step (f32) from 256.33 to 235.12 GiB while
compiling, short of the card: the chapters showed that figure as the step's plan. A guarded
step (`run_if`, as `gclab.notebook.run_if_fits` compiles) runs only where its plan fits,
below the pass's limit, where the pass changes nothing; so such a compile leaves it out and
a plan too large for the card is the step's own. Checked on the options handed to the
compile, with the backend named a GPU (no GPU here); the compile itself is not run.
"""

import jax
import pytest

from gclab.config import get_preset
from gclab.memory import MemoryConfig
from gclab.sizing import StepSpec, step


class Compiled(Exception):
    """Stops the step at its compile, carrying the options it was given."""


@pytest.fixture
def options_of(monkeypatch):
    def compile_timed(fn, args, kwargs, donate_argnums=(), compiler_options=None):
        raise Compiled(compiler_options)

    monkeypatch.setattr(step, "compile_timed", compile_timed)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    preset = get_preset("cpu-4x32")
    spec = StepSpec(preset.model, preset.task, MemoryConfig())

    def options(backend, **kwargs):
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
        with pytest.raises(Compiled) as e:
            step.compile_train_step(spec, **kwargs)
        return e.value.args[0]

    return options


def test_a_guarded_compile_on_a_gpu_leaves_the_remat_pass_out(options_of):
    assert options_of("gpu", live=True, run_if=lambda m: True) == {
        "xla_disable_hlo_passes": "rematerialization"}


def test_other_compiles_keep_their_options(options_of):
    assert options_of("gpu", live=True) is None  # a step to run, unguarded: XLA's defaults
    assert options_of("gpu") is None  # a plan for this card (plans_for_another_card: out)
    assert options_of("cpu", live=True, run_if=lambda m: True) is None  # CPU: defaults
    assert options_of("cpu") is not None  # a CPU plan: the cheap plan-only options
