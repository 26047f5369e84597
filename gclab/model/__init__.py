"""The GraphCast network (Haiku parameters, pure-JAX computation) and the official names.

| module | what it is for |
|---|---|
| `layers` | parameter modules with the official names; MLP, LayerNorm, edge messages |
| `graphcast` | encoder, processor, decoder; `make_network`, `GraphInputs` |
| `official` | official flat parameter names <-> gclab's stacked tree |
| `reference` | checks against fixtures written by the official code |
"""

from gclab.model.graphcast import (
    GraphInputs,
    ParamMismatch,
    count_params,
    decoder,
    encoder,
    graph_input_shapes,
    graph_inputs,
    graph_inputs_from_arrays,
    graphcast_forward,
    make_network,
    param_mismatches,
    param_shapes,
    processor,
)
from gclab.model.layers import edge_messages, layer_norm, mlp, mlp_concat, project
from gclab.model.official import flat_to_nested, from_official, to_official
from gclab.model.reference import (
    Check,
    Fixture,
    FixtureError,
    load_fixture,
    run_checks,
    ties_broken_differently,
)

__all__ = [
    "Check", "Fixture", "FixtureError", "GraphInputs", "count_params", "decoder",
    "edge_messages", "encoder", "flat_to_nested", "from_official", "graph_input_shapes",
    "graph_inputs", "graph_inputs_from_arrays", "graphcast_forward", "layer_norm",
    "load_fixture", "make_network", "mlp", "mlp_concat", "ParamMismatch", "param_mismatches",
    "param_shapes", "processor", "project", "run_checks", "ties_broken_differently",
    "to_official",
]
