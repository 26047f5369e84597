"""Bytes a partitioned program communicates, read from its optimised HLO.

After SPMD partitioning, every transfer between devices is one collective instruction of
the per-device program: `all-gather`, `all-reduce`, `reduce-scatter`,
`collective-permute`, `all-to-all` (or the `-start`/`-done` pair of its asynchronous form).
`collective_bytes` adds up the bytes of each one's result, once per execution: an
instruction inside a `while` loop with a known trip count (a `lax.scan`: processor steps,
edge blocks, rollout steps) counts that many times. Result bytes are what each device
receives (all-gather, all-to-all) or holds after the reduction (all-reduce,
reduce-scatter), a measure of traffic per device and step, not of link time.

A `conditional` (`lax.switch`, `lax.cond`: a pipeline's stages are the branches of one)
runs one branch per execution, and which one differs between devices: its bytes are, per
kind, the largest of its branches' (those of the busiest device), never their sum. Where
different branches are the largest for different kinds, `total` may exceed what any one
device sends.
"""

from __future__ import annotations

import re

import numpy as np

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                "c128": 16}
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.+?)\s+([\w\-]+)\((.*)$")
# A computation one instruction runs (a while's body and condition, a fusion, a reducer):
# group 1, or a list of them (`calls={%a, %b}`): group 2. Branches of a conditional, of
# which one runs: group 3 (`branch_computations={%b0, %b1, ...}`), or `_TWO_BRANCHES`
# (the two-branch form `true_computation=%t, false_computation=%f`).
_CALLS = re.compile(
    r"\b(?:body|condition|calls|to_apply)=(?:%?([\w.\-]+)|\{([^}]*)\})"
    r"|\bbranch_computations=\{([^}]*)\}")
_TWO_BRANCHES = re.compile(r"\btrue_computation=%?([\w.\-]+),\s*false_computation=%?([\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_OP_NAME = re.compile(r'\bop_name="([^"]*)"')
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")


def _shape_bytes(result_type: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(result_type):
        total += _DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
    return total


def _collective_kind(opcode: str) -> str | None:
    """The collective an opcode is (its `-done` half for asynchronous pairs), else None."""
    if opcode in COLLECTIVES:
        return opcode
    if opcode.endswith("-done") and opcode[:-5] in COLLECTIVES:
        return opcode[:-5]
    return None


def _names(listed: str) -> list[str]:
    """Computation names of ``%a, %b`` (an HLO list's inside)."""
    return [n.strip().lstrip("%") for n in listed.split(",") if n.strip().lstrip("%")]


def _parse(hlo_text: str):
    """`(entry, calls, own, found, branches)` of a program's HLO text.

    `entry`: the entry computation's name. `calls`: computation -> [(callees, times)], where
    all of one entry's callees run, except a conditional's (one tuple of its branches), of
    which one runs. `own`: computation ->
    {kind: bytes} of its own collectives. `found`: computation -> [(opcode, label)] of its
    own collective instructions (the `-start` of an asynchronous pair, not its `-done`),
    labelled by their `op_name` (else the instruction's name). `branches`: every branch
    computation of a conditional.
    """
    calls: dict[str, list[tuple[tuple[str, ...], int]]] = {}
    own: dict[str, dict[str, int]] = {}
    found: dict[str, list[tuple[str, str]]] = {}
    branches: list[str] = []
    entry, current = None, None
    for line in hlo_text.splitlines():
        if not line.startswith((" ", "\t")) and line.rstrip().endswith("{"):
            m = _COMPUTATION.match(line.strip())
            if m:
                current = m.group(1)
                calls.setdefault(current, [])
                own.setdefault(current, {})
                found.setdefault(current, [])
                if line.startswith("ENTRY"):
                    entry = current
            continue
        m = _INSTRUCTION.match(line) if current else None
        if m is None:
            continue
        result_type, opcode, rest = m.groups()
        kind = _collective_kind(opcode)
        if kind is not None:
            own[current][kind] = own[current].get(kind, 0) + _shape_bytes(result_type)
        base = opcode[:-6] if opcode.endswith("-start") else opcode
        if base in COLLECTIVES:
            label = _OP_NAME.search(rest) or _NAME.match(line)
            found[current].append((base, label.group(1)))
        trips = _TRIPS.search(rest)
        body = _BODY.search(rest) if opcode == "while" else None
        for one, several, listed in _CALLS.findall(rest):
            if listed:
                calls[current].append((tuple(_names(listed)), 1))
                branches += _names(listed)
                continue
            for name in [one] if one else _names(several):
                times = int(trips.group(1)) if (body and name == body.group(1) and trips) else 1
                calls[current].append(((name,), times))
        for pair in _TWO_BRANCHES.findall(rest):
            calls[current].append((pair, 1))
            branches += pair
    return entry, calls, own, found, branches


def branch_collectives(hlo_text: str,
                       kinds: tuple[str, ...] = ("collective-permute",)) -> list[str]:
    """The collectives of `kinds` that run inside a branch of a conditional.

    A branch runs only on the devices whose predicate or index picks it, and a pipeline's
    stages (`gclab.parallel.pipeline.gpipe`) are the branches of one conditional, each
    device running its own stage's. A collective inside a branch waits for devices that run
    another branch and never arrive (XLA:CPU's collective-permute waits for every device of
    the program, whatever its source-target pairs): the program hangs.

    Args:
      hlo_text: the optimised HLO of a compiled program (`Compiled.as_text()`).
      kinds: the collectives to look for (of `COLLECTIVES`; asynchronous ones by their
        `-start`).

    Returns:
      Each such instruction's `op_name` (where JAX put it: what the program was doing), else
      its HLO name, once per instruction, in the order of the text; computations a branch
      calls (fusions, loops, calls, nested conditionals) are inside it too.
    """
    _, calls, _, found, branches = _parse(hlo_text)
    inside: set[str] = set()
    stack = list(branches)
    while stack:
        name = stack.pop()
        if name in inside:
            continue
        inside.add(name)
        stack += [callee for callees, _ in calls.get(name, []) for callee in callees]
    return [label for name, listed in found.items() if name in inside
            for kind, label in listed if kind in kinds]


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes of each collective kind, per device and per execution of the program.

    A conditional counts, per kind, its branch with the most bytes of that kind (see the
    module's docstring).

    Args:
      hlo_text: the optimised HLO of a compiled program (`Compiled.as_text()`).

    Returns:
      `{kind: bytes}` for every kind of `COLLECTIVES` (0 where absent), and `total`.
    """
    entry, calls, own, _, _ = _parse(hlo_text)

    def total_of(name: str, seen: tuple = ()) -> dict[str, int]:
        out = dict(own.get(name, {}))
        for callees, times in calls.get(name, []):
            # One of several branches runs: per kind, the most any of them sends.
            most: dict[str, int] = {}
            for callee in callees:
                if callee in seen:
                    continue
                for kind, b in total_of(callee, seen + (name,)).items():
                    most[kind] = max(most.get(kind, 0), b)
            for kind, b in most.items():
                out[kind] = out.get(kind, 0) + times * b
        return out

    totals = total_of(entry) if entry else {}
    result = {kind: int(totals.get(kind, 0)) for kind in COLLECTIVES}
    result["total"] = sum(result.values())
    return result
