"""Chapters 2 and 3 compare compiled plans with each other and with a counting model: on a GPU
each must be the program's own plan, compiled without XLA:GPU's rematerialization pass, which
shrinks only the plans above the card's memory. And the words of chapter 3 that say how long
the recipes take hold on a card where no remat does not fit."""

import ast
import json
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
#: gclab's functions that compile a training step's plan.
PLANNERS = {"compile_train_step", "train_step_memory", "train_step_timeline",
            "planned_and_measured"}


def _code_cells(name):
    notebook = json.loads((ROOT / "book" / f"{name}.ipynb").read_text())
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]


def _unguarded_plans(source):
    """Calls of `PLANNERS` in `source` outside ``with plans_for_another_card(True):``."""
    found = []

    def visit(node, guarded):
        if isinstance(node, ast.With):
            guarded = guarded or any(
                isinstance(item.context_expr, ast.Call)
                and getattr(item.context_expr.func, "id", None) == "plans_for_another_card"
                and [ast.literal_eval(a) for a in item.context_expr.args] in ([], [True])
                for item in node.items)
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in PLANNERS
                and not guarded):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(ast.parse(source), False)
    return found


@pytest.mark.parametrize("name", ["02_forward_activations", "03_remat"])
def test_every_plan_a_chapter_compares_is_the_programs_own_on_a_gpu(name):
    # The finder itself: a plan inside the switch is guarded, one outside or switched off not.
    assert _unguarded_plans("with plans_for_another_card(True):\n    m = train_step_memory(s)\n"
                            ) == []
    assert len(_unguarded_plans("m = train_step_memory(s)\n"
                                "with plans_for_another_card(False):\n"
                                "    t = compile_train_step(s)\n")) == 2
    cells = _code_cells(name)
    assert any(planner in cell for cell in cells for planner in PLANNERS), name
    unguarded = {i: found for i, cell in enumerate(cells) if (found := _unguarded_plans(cell))}
    assert not unguarded, f"{name}: plans compiled with XLA's remat pass on a GPU: {unguarded}"


LABELS = ("none", "step", "+ edge blocks (deepmind)", "lean")


def _times_said(ran_labels):
    """What chapter 3.4's cell glues, for the configurations in `ran_labels` timed."""
    (source,) = [c for c in _code_cells("03_remat") if 'glue("time_sentence"' in c]
    glued = {}
    ran = pd.Series({label: 1.0 + 0.25 * i for i, label in enumerate(ran_labels)}, dtype=float)
    exec(source, {"ran": ran, "LIVE_RUNS": dict.fromkeys(LABELS),
                  "glue": lambda key, value: glued.__setitem__(key, value)})
    return glued


def test_chapter_3_times_are_against_no_remat_where_it_ran():
    said = _times_said(LABELS)
    assert said["time_sentence"] == ("per-step remat takes 1.25 times as long as no remat, the "
                                     "authors' recipe 1.50 times and the lean recipe 1.75 times.")
    assert "show that price" in said["time_price_here"]
    assert "cannot" not in said["time_price_here"]


def test_chapter_3_says_what_did_not_fit_where_no_remat_did_not_run():
    said = _times_said(LABELS[2:])  # a big scale's card: the published model without remat
    assert said["time_sentence"] == ("no remat and per-step remat do not fit this device and "
                                     "are not timed; the lean recipe takes 1.25 times as long "
                                     "as the authors' recipe.")
    assert "cannot show that price" in said["time_price_here"]
    nothing = _times_said(())
    assert nothing["time_sentence"].endswith("the lean recipe do not fit this device and are "
                                             "not timed.")
    assert nothing["time_price_here"] == "Nothing was timed on this device."
