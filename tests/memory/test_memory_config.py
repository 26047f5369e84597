"""`MemoryConfig`'s processor remat parameters: none is kept where nothing reads it.

A policy where no step is checkpointed, a group size for a kind without groups and a ratio
for a kind other than `ratio` would be accepted, shown in the config's name, and do nothing;
they are refused. `replace` resets those its changes leave unread, so that callers that
switch the processor remat (pipeline stages, the planners) keep working.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gclab import cli
from gclab.memory import RECIPES, MemoryConfig, get_recipe, parse_remat_spec, scan_steps
from gclab.memory.config import recipe_name
from gclab.model.graphcast import stage_memory

TINY_NET = ["--resolution", "6", "--mesh-splits", "2", "--latent", "16", "--steps", "2"]


@pytest.mark.parametrize("fields", [
    dict(remat_policy="dots"),
    dict(processor_remat="none", remat_policy="aggregated"),
    dict(processor_remat="ratio", remat_ratio=0.0, remat_policy="node-latents"),
])
def test_a_policy_without_a_checkpointed_step_is_refused(fields):
    with pytest.raises(ValueError, match="MemoryConfig.remat_policy=.*no processor step is "
                       "checkpointed"):
        MemoryConfig(**fields)


@pytest.mark.parametrize("spec", ["none,policy=dots", "ratio:0,policy=node-latents"])
def test_a_spec_with_a_policy_and_no_checkpointed_step_is_refused(spec):
    with pytest.raises(ValueError, match="remat_policy"):
        parse_remat_spec(spec)


@pytest.mark.parametrize("spec", ["step,policy=dots", "ratio:0.5,policy=dots",
                                  "every:2,policy=aggregated", "nested:3,policy=node-latents"])
def test_a_policy_of_checkpointed_steps_is_kept(spec):
    assert MemoryConfig(**parse_remat_spec(spec)).remat_spec == spec


@pytest.mark.parametrize("fields,field", [
    (dict(processor_remat="step", remat_group_size=3), "remat_group_size"),
    (dict(remat_group_size=2), "remat_group_size"),
    (dict(processor_remat="ratio", remat_ratio=0.5, remat_group_size=2), "remat_group_size"),
    (dict(processor_remat="step", remat_ratio=0.5), "remat_ratio"),
    (dict(processor_remat="every", remat_group_size=2, remat_ratio=0.5), "remat_ratio"),
    (dict(processor_remat="nested", remat_group_size=2, remat_ratio=0.0), "remat_ratio"),
    (dict(remat_ratio=0.0), "remat_ratio"),
])
def test_a_parameter_the_remat_kind_does_not_read_is_refused(fields, field):
    with pytest.raises(ValueError, match=f"MemoryConfig.{field}=.*processor_remat="
                       f"'{fields.get('processor_remat', 'none')}'"):
        MemoryConfig(**fields)


def test_no_config_shows_a_parameter_that_does_nothing():
    """The review's case: `step` with a group size of 3 named itself `step`, and was no
    recipe, although it behaves as `per-step`."""
    with pytest.raises(ValueError, match="remat_group_size"):
        MemoryConfig(processor_remat="step", remat_group_size=3, remat_ratio=0.5)
    assert recipe_name(MemoryConfig(processor_remat="step")) == "per-step"


def test_replace_resets_what_the_new_remat_does_not_read():
    lean = get_recipe("lean")  # nested:4
    none = lean.replace(processor_remat="none")
    assert none.remat_spec == "none" and none.remat_group_size == 1
    assert none.replace(processor_remat="nested", remat_group_size=4) == lean
    ratio = lean.replace(processor_remat="ratio", remat_ratio=0.5)
    assert (ratio.remat_spec, ratio.remat_group_size) == ("ratio:0.5", 1)
    dots = MemoryConfig(**parse_remat_spec("ratio:0.5,policy=dots"))
    assert dots.replace(processor_remat="none") == MemoryConfig()
    assert dots.replace(remat_ratio=0.0).remat_spec == "ratio:0"
    assert dots.replace(processor_remat="step").remat_spec == "step,policy=dots"
    assert dots.replace(precision="bf16").remat_spec == "ratio:0.5,policy=dots"


@pytest.mark.parametrize("changes", [
    dict(processor_remat="step", remat_group_size=3),
    dict(processor_remat="none", remat_policy="dots"),
    dict(processor_remat="every", remat_group_size=2, remat_ratio=0.5),
])
def test_replace_still_refuses_what_it_is_told(changes):
    with pytest.raises(ValueError, match="MemoryConfig.remat_"):
        MemoryConfig().replace(**changes)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_pipeline_stage_remats_of_every_recipe(recipe):
    """`stage_memory` switches a recipe's remat to `none` or `ratio` for a stage."""
    mem = get_recipe(recipe)
    if mem.processor_remat != "none":
        mem = mem.replace(remat_policy="dots")
    zero = stage_memory(mem, 4, 0)
    assert (zero.remat_spec, zero.remat_group_size, zero.remat_policy) == ("none", 1, "nothing")
    two = stage_memory(mem, 4, 2)
    assert two.checkpointed_steps(4) == 2 and two.remat_group_size == 1
    assert two.remat_spec == "ratio:0.5" + (",policy=dots" if mem.processor_remat != "none"
                                            else "")


def test_the_command_line_refuses_a_policy_of_no_checkpointed_step(capsys):
    assert cli.main(["memory", *TINY_NET, "--remat", "none,policy=dots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "--remat none,policy=dots:" in err and "not after none or ratio:0" in err, err


def test_scan_steps_runs_a_group_above_the_steps_as_one_group():
    """Recipes on short models and pipeline stages shorter than a group rely on it."""
    stacked = jnp.arange(1.0, 4.0)  # S = 3

    def run(mem):
        def loss(carry):
            out, _ = scan_steps(lambda c, p: (jnp.sin(c * p), None), carry, stacked, mem)
            return out.sum()

        return jax.value_and_grad(loss)(jnp.ones(2))

    want = run(MemoryConfig())
    for spec in ("every:5", "nested:4", "every:3"):
        got = run(MemoryConfig(**parse_remat_spec(spec)))
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
