"""Memory timeline of a compiled function, read from XLA's own buffer assignment.

This is *not* a poll of the allocator: it is the plan XLA made for the optimised
module, the same plan that `Compiled.memory_analysis().temp_size_in_bytes` sums up.

How it is obtained (XLA facility)
---------------------------------
The function is compiled once more with per-compile XLA debug options
``{'xla_dump_to': <tmpdir>, 'xla_dump_hlo_as_text': True}`` passed through
``jax.jit(f).lower(...).compile(compiler_options=...)`` (no environment variables, no
subprocess; a fresh temporary directory per call also keeps JAX's compile cache from
skipping the compile). XLA then writes, for the optimised module:

* ``*after_optimizations-live-range.txt`` (``HloLiveRange``): the flattened schedule
  (``InstructionSequence``: the entry computation with the bodies of while loops,
  i.e. `lax.scan`, and conditionals inlined in execution order) and, for every HLO
  value, its live range ``[start, end]`` in that schedule;
* ``*after_optimizations-buffer-assignment.txt``: every allocation (parameter,
  constant, output, preallocated temp) with the values placed in it, their sizes and
  offsets.
* The optimised HLO (``compiled.as_text()``) supplies each instruction's
  ``op_name`` metadata (Haiku module names, `jax.named_scope` names, and
  ``transpose(jvp(...))`` for the backward pass) and its source stack frame.

For each point of the schedule, `live_bytes` is the number of distinct bytes of the
temp allocation(s) held by live values (values placed at the same offset and size
whose live ranges overlap are aliases of one buffer and are counted once). A loop
body appears once in XLA's schedule: its buffers are reused by every iteration, while
buffers carried across iterations (e.g. the residuals a scan stacks for the backward
pass) are live across the whole loop. By default the timeline repeats each loop body
once per iteration (known trip counts from the optimised HLO), so its x axis is
execution order, and labels the iterations of gclab's processor scans
``'processor step i'`` / ``'backward: processor step i'`` from the named scopes
`gclab.memory.remat.step_scope` puts around them. The bytes of each repetition are those XLA
planned for the body, so the peak is unchanged; a scan's stacked residuals are one
buffer allocated whole before its loop, which is why the forward rises in a block,
not step by step.

Margin against `temp_bytes`
---------------------------
XLA packs values into the temp allocation with a heap simulator; the allocation size
is the peak of bytes live plus any fragmentation (holes the packing could not
fill), so ``peak_bytes <= temp_bytes``. Stated (and tested) margin: ``peak_bytes`` is
within 5% below ``temp_bytes``; measured on XLA:CPU (jax 0.10.2) toys, a scanned
encoder/processor/decoder with and without remat at several sizes: 0.998-1.000.
`Timeline.fragmentation_bytes` shows the gap.

Stages
------
Each point is labelled by the first matching rule of `stage_rules`, a sequence of
``(pattern, label)`` where pattern is a substring or a compiled regex matched against
``"<op_name> @ <file>:<function>"`` (op_name without its leading
``jit(<name>)/``, file and function of the innermost source frame); a regex label
may use group references (``r"processor step \\1"``).
Instructions under ``transpose(...)`` get the prefix ``'backward: '``. Instructions
with no match inherit the stage of the computation they call (fusions, while
bodies), else of the previous point.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import glob
import os
import re
import shutil
import tempfile
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Union

import jax
import numpy as np
import pandas as pd
from jax.experimental.compilation_cache.compilation_cache import reset_cache

from gclab.config import WrongType, a_kind, require_kind
from gclab.measure.compiled import (
    compile_timed,
    format_bytes,
    known_options,
    memory_of_compiled,
    plan_only_options,
    platform_of,
    require_plannable,
    target_device,
    target_platform,
)
from gclab.memory.remat import STEP_SCOPE_PREFIX

__all__ = [
    "DEFAULT_STAGE_RULES",
    "TIMELINE_COMPILER_OPTIONS",
    "LiveValue",
    "Timeline",
    "compile_with_timeline",
    "label_op",
    "memory_timeline",
    "timeline_compiler_options",
    "timeline_from_dump",
]

StageRule = tuple[Union[str, "re.Pattern[str]"], str]

BACKWARD_PREFIX = "backward: "

#: Default op_name -> stage rules for GraphCast (first match wins; order matters:
#: ``grid2mesh_gnn`` contains ``mesh_gnn``).
DEFAULT_STAGE_RULES: tuple[StageRule, ...] = (
    (re.compile(r"optax|optimi[sz]er|apply_updates|scale_by_adam|adamw?\b"), "optimizer"),
    ("grid2mesh", "encoder"),
    ("encoder", "encoder"),
    ("mesh2grid", "decoder"),
    ("decoder", "decoder"),
    (re.compile(r"processor[_ /]?step[_ ]?(\d+)"), r"processor step \1"),
    (re.compile(r"mesh_gnn[^/]*/[^ ]*?step[_ ]?(\d+)"), r"processor step \1"),
    ("mesh_gnn", "processor"),
    ("processor", "processor"),
    (re.compile(r"(?:^|[/(])loss"), "loss"),
    (re.compile(r"@ training\.py:"), "loss"),
)

_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMP_RE = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?.*\{\s*$")
_OPNAME_RE = re.compile(r'op_name="([^"]*)"')
_JIT_PREFIX_RE = re.compile(r"^(?:jit|pjit)\([^)]*\)/")
_FRAME_RE = re.compile(r"stack_frame_id=(\d+)")
_CALLS_RE = re.compile(
    r"(?:calls|body|condition|to_apply|true_computation|false_computation)=%?([\w.\-]+)"
)
_WHILE_RE = re.compile(r"\swhile\(")
_TRIP_RE = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_BRANCHES_RE = re.compile(r"branch_computations=\{([^}]*)\}")
_ALLOC_RE = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
_VALUE_RE = re.compile(r"^\s*value: <\d+ ([^ >]+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\)")
_SEQ_RE = re.compile(r"^\s*(\d+):(\S+)\s*$")
_TYPE_RE = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\([^=]*?\)|[\w\[\],{}:()]+?)\s+[\w\-]+\(")
_RANGE_RE = re.compile(r"^\s*(\S+\{[^}]*\}):(\d+)-(\d+)\s*$")
#: Module names from about this length on make dump file names longer than a file system
#: takes (255 bytes): XLA then writes no file for the module (it logs "File name too long").
_LONGEST_NAMED_MODULE = 180


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Bytes live in XLA's temp buffer at each point of the compiled schedule.

    Attributes:
      live_bytes: int64 [P], distinct temp bytes held by live values at each point.
      stage: str [P], stage label of each point.
      instruction: str [P], HLO instruction name of each point.
      op_name: str [P], the instruction's op_name metadata ('' if none).
      peak_bytes: max of `live_bytes`.
      peak_index: first point where the peak is reached.
      temp_bytes: the compiled module's `temp_size_in_bytes` (allocation size).
      argument_bytes: the compiled module's argument bytes.
      output_bytes: the compiled module's output bytes.
      backend: platform compiled for.
      name: a label for plots (the function's name by default).
      unrolled: whether loop bodies are repeated once per iteration (see
        `timeline_from_dump`); if not, a loop body appears once.
      loops_note: where loops were to be repeated but were not, or were repeated but none
        is a scan over processor steps (so no stage is numbered): why, in words ('' where
        the steps are numbered, or loops were not to be repeated).
      peak_values: the values live at the peak, largest first: one `LiveValue` per
        buffer (aliases of one buffer counted once), so their bytes sum to `peak_bytes`.
      dump_dir: the folder the XLA dump was kept in (`memory_timeline`'s `keep_dump`),
        '' if it was not kept.
    """

    live_bytes: np.ndarray
    stage: np.ndarray
    instruction: np.ndarray
    op_name: np.ndarray
    peak_bytes: int
    peak_index: int
    temp_bytes: int
    argument_bytes: int = 0
    output_bytes: int = 0
    backend: str = ""
    name: str = ""
    unrolled: bool = False
    peak_values: tuple["LiveValue", ...] = ()
    loops_note: str = ""
    dump_dir: str = ""

    def __len__(self) -> int:
        return int(self.live_bytes.shape[0])

    @property
    def peak_stage(self) -> str:
        """Stage label at the peak."""
        return str(self.stage[self.peak_index]) if len(self) else ""

    @property
    def fragmentation_bytes(self) -> int:
        """`temp_bytes - peak_bytes`: bytes XLA's packing could not reuse."""
        return int(self.temp_bytes - self.peak_bytes)

    def stages(self) -> list[str]:
        """Distinct stage labels in order of first appearance."""
        return list(dict.fromkeys(self.stage.tolist()))

    def to_dataframe(self) -> pd.DataFrame:
        """One row per schedule point: point, instruction, stage, op_name, live_bytes."""
        return pd.DataFrame(
            {
                "point": np.arange(len(self)),
                "instruction": self.instruction,
                "stage": self.stage,
                "op_name": self.op_name,
                "live_bytes": self.live_bytes,
            }
        )

    def stage_summary(self) -> pd.DataFrame:
        """Per stage: number of points and the maximum bytes live while it runs."""
        df = self.to_dataframe()
        out = df.groupby("stage", sort=False)["live_bytes"].agg(["size", "max"])
        return out.rename(columns={"size": "points", "max": "peak_bytes"}).reset_index()

    def peak_table(self, top: int | None = None) -> pd.DataFrame:
        """What holds memory at the peak: one row per live buffer, largest first.

        Columns: instruction, shape (HLO type, e.g. ``bf16[1038240,512]``), bytes, stage
        (where the value was made), op_name. `top` keeps the largest rows and sums the rest
        into one row ``'(others)'``.
        """
        rows = [dataclasses.asdict(v) for v in self.peak_values]
        df = pd.DataFrame(rows, columns=["instruction", "shape", "bytes", "stage", "op_name"])
        if top is not None and len(df) > top:
            rest = df.iloc[top:]
            df = pd.concat([df.iloc[:top], pd.DataFrame([{
                "instruction": "(others)", "shape": f"{len(rest)} buffers",
                "bytes": int(rest["bytes"].sum()), "stage": "", "op_name": ""}])],
                ignore_index=True)
        return df

    def __str__(self) -> str:
        return (
            f"Timeline({self.name!r}, {len(self)} points, peak "
            f"{format_bytes(self.peak_bytes)} in {self.peak_stage!r}, temp "
            f"{format_bytes(self.temp_bytes)})"
        )


@dataclasses.dataclass(frozen=True)
class LiveValue:
    """One buffer live at a timeline's peak (see `Timeline.peak_values`)."""

    instruction: str
    shape: str
    bytes: int
    stage: str
    op_name: str


# ----------------------------------------------------------------------------- labels


def label_op(text: str, stage_rules: Sequence[StageRule] | None = None) -> str | None:
    """Stage of one instruction from its op_name (and source location) text.

    Args:
      text: ``op_name`` (optionally followed by ``" @ file:function"``).
      stage_rules: ``(substring or regex, label)`` pairs, first match wins;
        defaults to `DEFAULT_STAGE_RULES`.

    Returns:
      The label, prefixed with ``'backward: '`` for ops under ``transpose(``; None if
      no rule matched.
    """
    rules = DEFAULT_STAGE_RULES if stage_rules is None else stage_rules
    label = None
    for pattern, target in rules:
        if isinstance(pattern, re.Pattern):
            match = pattern.search(text)
            if match:
                label = match.expand(target)
                break
        elif pattern in text:
            label = target
            break
    if label is None:
        return None
    if "transpose(" in text and not label.startswith(BACKWARD_PREFIX) and label != "optimizer":
        label = BACKWARD_PREFIX + label
    return label


# ----------------------------------------------------------------------------- parsing


def _parse_hlo(text: str) -> tuple[dict[str, str], dict[str, list[str]], dict[str, list[str]]]:
    """op text per instruction, callees per instruction, instructions per computation."""
    files: dict[str, str] = {}
    funcs: dict[str, str] = {}
    locs: dict[str, tuple[str, str]] = {}
    frames: dict[str, str] = {}
    section = ""
    op_text: dict[str, str] = {}
    frame_of: dict[str, str] = {}
    callees: dict[str, list[str]] = {}
    members: dict[str, list[str]] = collections.defaultdict(list)
    comp = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = stripped
            continue
        if section and stripped and stripped[0].isdigit():
            key, _, rest = stripped.partition(" ")
            if section == "FileNames":
                files[key] = rest.strip('"')
            elif section == "FunctionNames":
                funcs[key] = rest.strip('"')
            elif section == "FileLocations":
                f = re.search(r"file_name_id=(\d+)", rest)
                g = re.search(r"function_name_id=(\d+)", rest)
                locs[key] = (f.group(1) if f else "", g.group(1) if g else "")
            elif section == "StackFrames":
                f = re.search(r"file_location_id=(\d+)", rest)
                frames[key] = f.group(1) if f else ""
            continue
        if not stripped:
            section = ""
            continue
        # Computation headers start at column 0 (their signatures may hold "/*index=5*/").
        if not line[0].isspace() and stripped.endswith("{"):
            cm = _COMP_RE.match(line)
            if cm:
                comp = cm.group(1)
            continue
        im = _INSTR_RE.match(line)
        if not im:
            continue
        name, rest = im.group(1), im.group(2)
        members[comp].append(name)
        om = _OPNAME_RE.search(rest)
        # Drop the outermost "jit(<function name>)/": it names the whole program.
        op_text[name] = _JIT_PREFIX_RE.sub("", om.group(1)) if om else ""
        fm = _FRAME_RE.search(rest)
        if fm:
            frame_of[name] = fm.group(1)
        called = _CALLS_RE.findall(rest)
        bm = _BRANCHES_RE.search(rest)
        if bm:
            called += [c.strip().lstrip("%") for c in bm.group(1).split(",") if c.strip()]
        if called:
            callees[name] = called
    for name, frame in frame_of.items():
        loc = locs.get(frames.get(frame, ""), ("", ""))
        where = f"{os.path.basename(files.get(loc[0], ''))}:{funcs.get(loc[1], '')}"
        if where != ":":
            op_text[name] = f"{op_text[name]} @ {where}"
    return op_text, callees, dict(members)


def _trip_counts(text: str) -> dict[str, int]:
    """Known trip count of every ``while`` instruction of the optimised HLO."""
    trips: dict[str, int] = {}
    for line in text.splitlines():
        if not _WHILE_RE.search(line):
            continue
        im, tm = _INSTR_RE.match(line), _TRIP_RE.search(line)
        if im and tm:
            trips[im.group(1)] = int(tm.group(1))
    return trips


@dataclasses.dataclass
class _Loop:
    start: int  # first point of the loop's (inlined) body and condition
    stop: int  # the while instruction's own point, just after them
    name: str
    trips: int
    inner: list[_Loop] = dataclasses.field(default_factory=list)


def _loops(
    sequence: Sequence[str],
    callees: dict[str, list[str]],
    members: dict[str, list[str]],
    trips: dict[str, int],
) -> list[_Loop]:
    """Outermost while loops of the schedule, each with the loops nested in it.

    HloLiveRange inlines a loop's condition and body once, just before the ``while``
    instruction. A loop is kept only if its inlined points form one contiguous run.
    """
    index = {name: i for i, name in enumerate(sequence)}
    found: list[_Loop] = []
    for name, n in trips.items():
        if name not in index:
            continue
        inside: set[str] = set()
        todo = list(callees.get(name, ()))
        seen: set[str] = set()
        while todo:
            comp = todo.pop()
            if comp in seen:
                continue
            seen.add(comp)
            for inner in members.get(comp, ()):
                inside.add(inner)
                todo.extend(callees.get(inner, ()))
        points = [index[x] for x in inside if x in index]
        stop = index[name]
        if not points or min(points) >= stop:
            continue
        start = min(points)
        if all(sequence[i] in inside for i in range(start, stop)):
            found.append(_Loop(start, stop, name, n))
    found.sort(key=lambda loop: (loop.start, -loop.stop))
    roots: list[_Loop] = []
    open_loops: list[_Loop] = []
    for loop in found:
        while open_loops and loop.start >= open_loops[-1].stop:
            open_loops.pop()
        (open_loops[-1].inner if open_loops else roots).append(loop)
        open_loops.append(loop)
    return roots


#: A stage label that numbers a step ('processor step 3', 'backward: processor step 0').
_NUMBERED_RE = re.compile(r" step \d+$")


def _why_not_numbered(
    hlo_text: str,
    sequence: Sequence[str],
    trips: dict[str, int],
    loops: Sequence[_Loop],
    step_loops: dict[str, tuple[int, int, bool]],
) -> str:
    """Why a timeline numbers no processor step, in words ('' where it can).

    The steps are numbered from the repeated bodies of the scans over processor steps;
    each stage below names the first link of that chain the optimised program lacks, so
    that a backend which schedules its loops differently says where it parts from XLA:CPU.
    """
    if STEP_SCOPE_PREFIX not in hlo_text:
        return "no instruction of the optimised program is in a processor step's scope"
    whiles = sum(1 for line in hlo_text.splitlines()
                 if _WHILE_RE.search(line) and _INSTR_RE.match(line))
    if not whiles:
        return "the optimised program has no while loop"
    if not trips:
        return f"none of its {whiles} while loops has a trip count XLA knows"
    if not loops:
        in_schedule = sum(1 for name in trips if name in set(sequence))
        if not in_schedule:
            return (f"none of its {len(trips)} while loops with a known trip count is in "
                    "the schedule XLA dumped")
        return (f"the bodies of its {in_schedule} scheduled while loops are not each one "
                "contiguous run of the schedule, so they cannot be repeated")
    if not step_loops:
        return (f"its {len(trips)} while loops are repeated, but none is a scan over "
                "processor steps (no op_name in a step scope ending in the loop)")
    return "its step scans are repeated, but no point of the schedule lies in one step"


def _unroll(
    start: int, stop: int, loops: Sequence[_Loop]
) -> list[tuple[int, tuple[tuple[str, int, int], ...]]]:
    """Points of ``[start, stop)`` with every loop body repeated once per iteration.

    Each entry is ``(point, ((while name, iteration, trips), ...))``, outermost first.
    """
    out: list[tuple[int, tuple[tuple[str, int, int], ...]]] = []
    pos = start
    for loop in loops:
        out.extend((i, ()) for i in range(pos, loop.start))
        body = _unroll(loop.start, loop.stop, loop.inner)
        for k in range(loop.trips):
            out.extend((i, ((loop.name, k, loop.trips), *tags)) for i, tags in body)
        pos = loop.stop
    out.extend((i, ()) for i in range(pos, stop))
    return out


_STEP_SCOPE_RE = re.compile(
    rf"{STEP_SCOPE_PREFIX}(\d+)_(\d+)((?:/(?!{STEP_SCOPE_PREFIX})[^/ ]+)*)")


def _step_loops(op_text: dict[str, str], trips: dict[str, int]) -> dict[str, tuple[int, int, bool]]:
    """``while`` -> (offset, stride, reversed) for the scans over processor steps.

    gclab runs its processor steps as scans inside ``jax.named_scope(step_scope(o, s))``
    (`gclab.memory.remat.step_scope`): iteration k of such a loop runs step ``o + k * s``,
    offsets of nested step loops adding up. The transpose of a scan (its backward,
    ``transpose(...)`` in the op_name) iterates in reverse; a forward scan recomputed
    inside the backward pass (``rematted_computation``) does not.
    """
    out = {}
    for name in trips:
        text = op_text.get(name, "").split(" @ ")[0]
        matches = list(_STEP_SCOPE_RE.finditer(text))
        if not matches:
            continue
        m = matches[-1]
        # The loop is the scan called in that scope: 'while' is the path's last part,
        # with no loop body in between.
        rest = m.group(3).split("/")[1:]
        if not rest or rest[-1] != "while" or "while" in rest[:-1] or "body" in rest:
            continue
        backward = "transpose(" in text and "rematted_computation" not in text
        out[name] = (int(m.group(1)), int(m.group(2)), backward)
    return out


@functools.lru_cache(maxsize=None)
def _body_scopes(text: str) -> tuple[tuple[int, int], ...]:
    """(offset, stride) of the step scans an op sits in the body of, outermost first.

    Cached: an unrolled timeline asks once per iteration for the same op_name.
    """
    out = []
    for m in _STEP_SCOPE_RE.finditer(text.split(" @ ")[0]):
        rest = m.group(3).split("/")
        if any(a == "while" and b == "body" for a, b in zip(rest, rest[1:])):
            out.append((int(m.group(1)), int(m.group(2))))
    return tuple(out)


def _step_label(
    stage: str,
    text: str,
    tags: Sequence[tuple[str, int, int]],
    step_loops: dict[str, tuple[int, int, bool]],
    numbered: Sequence[str],
) -> str:
    """'<stage> step i' for a point inside one iteration of a processor step loop.

    The step is the sum, over the enclosing step loops, of offset + iteration * stride.
    A step scan of one iteration has no loop left in the optimised module (XLA inlines
    it); it is found in the op_name (`text`) and counts its offset. Points in a loop
    over groups of steps but in no single step (stride > 1), and ops XLA hoisted out of
    a step loop, keep their stage.
    """
    base = stage[len(BACKWARD_PREFIX):] if stage.startswith(BACKWARD_PREFIX) else stage
    if base not in numbered:
        return stage
    scopes = list(_body_scopes(text))
    step, stride = 0, 0
    for name, k, n in tags:
        if name in step_loops:
            offset, stride, backward = step_loops[name]
            step += offset + (n - 1 - k if backward else k) * stride
            if (offset, stride) in scopes:
                scopes.remove((offset, stride))
            elif scopes:
                scopes = []  # op_name and loops disagree: trust the loops
    if scopes:
        if any(loop[:2] in scopes for loop in step_loops.values()):
            return stage  # hoisted out of a step loop by XLA: in no single step
        step += sum(offset for offset, _ in scopes)
        stride = scopes[-1][1] if stride != 1 else stride
    return f"{stage} step {step}" if stride == 1 else stage


def _parse_live_range(text: str) -> tuple[list[str], dict[str, tuple[int, int]]]:
    sequence: list[str] = []
    ranges: dict[str, tuple[int, int]] = {}
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("InstructionSequence"):
            section = "seq"
            continue
        if stripped.startswith("BufferLiveRange"):
            section = "range"
            continue
        if stripped.startswith("Live ranges at") or stripped.startswith("Stack trace"):
            break
        if section == "seq":
            m = _SEQ_RE.match(line)
            if m:
                sequence.append(m.group(2))
        elif section == "range":
            m = _RANGE_RE.match(line)
            if m:
                ranges[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return sequence, ranges


def _parse_buffer_assignment(text: str) -> list[tuple[str, int, int, int]]:
    """(value key, allocation, offset, size) for values in temp allocations."""
    out: list[tuple[str, int, int, int]] = []
    alloc: int | None = None
    for line in text.splitlines():
        am = _ALLOC_RE.match(line)
        if am:
            attrs = am.group(3)
            is_temp = not any(
                tag in attrs
                for tag in ("parameter", "constant", "maybe-live-out", "thread-local", "output")
            )
            alloc = int(am.group(1)) if is_temp else None
            continue
        if line.startswith("Total bytes used") or line.startswith("Used values"):
            break
        if alloc is None:
            continue
        vm = _VALUE_RE.match(line)
        if vm:
            key = vm.group(1)
            if not key.endswith("}"):
                key += "{}"
            out.append((key, alloc, int(vm.group(3)), int(vm.group(2))))
    return out


def _live_bytes(
    num_points: int,
    values: Sequence[tuple[str, int, int, int]],
    ranges: dict[str, tuple[int, int]],
) -> np.ndarray:
    by_chunk: dict[tuple[int, int, int], list[tuple[int, int]]] = collections.defaultdict(list)
    for key, alloc, offset, size in values:
        if size <= 0 or key not in ranges:
            continue
        by_chunk[(alloc, offset, size)].append(ranges[key])
    delta = np.zeros(num_points + 1, np.int64)
    for (_, _, size), spans in by_chunk.items():
        spans.sort()
        start, end = spans[0]
        for s, e in spans[1:]:
            if s <= end:  # overlapping at the same place: aliases of one buffer
                end = max(end, e)
            else:
                delta[start] += size
                delta[min(end, num_points - 1) + 1] -= size
                start, end = s, e
        delta[start] += size
        delta[min(end, num_points - 1) + 1] -= size
    return np.cumsum(delta[:num_points])


def _live_at(
    point: int,
    values: Sequence[tuple[str, int, int, int]],
    ranges: dict[str, tuple[int, int]],
) -> list[tuple[str, int]]:
    """(value key, size) of the buffers live at `point`, one per buffer, as `_live_bytes`."""
    by_chunk: dict[tuple[int, int, int], list[tuple[int, int, str]]] = collections.defaultdict(list)
    for key, alloc, offset, size in values:
        if size > 0 and key in ranges:
            by_chunk[(alloc, offset, size)].append((*ranges[key], key))
    live = []
    for (_, _, size), spans in by_chunk.items():
        spans.sort()
        start, end, keys = spans[0][0], spans[0][1], [spans[0][2]]
        groups = []
        for s, e, key in spans[1:]:
            if s <= end:
                end = max(end, e)
                keys.append(key)
            else:
                groups.append((start, end, keys))
                start, end, keys = s, e, [key]
        groups.append((start, end, keys))
        for s, e, keys in groups:
            if s <= point <= e:
                # The value defined first names the buffer (later ones alias it).
                live.append((min(keys, key=lambda k: ranges[k][0]), size))
    return sorted(live, key=lambda kv: -kv[1])


def _hlo_types(text: str) -> dict[str, str]:
    """The result type of every HLO instruction (e.g. ``bf16[1038240,512]{1,0}``)."""
    out = {}
    for line in text.splitlines():
        m = _TYPE_RE.match(line)
        if m:
            out[m.group(1)] = re.sub(r"\{[\d,:A-Z()]*\}", "", m.group(2))
    return out


def _element_type(hlo_type: str, index: str) -> str:
    """The type at tuple index `index` (e.g. ``'1,0'``) of an HLO type; `hlo_type` if none."""
    for i in (int(k) for k in index.split(",") if k.strip()):
        if not hlo_type.startswith("("):
            break
        parts, depth, start = [], 0, 1
        for j, ch in enumerate(hlo_type):
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            if (ch == "," and depth == 1) or (ch == ")" and depth == 0):
                parts.append(hlo_type[start:j].strip())
                start = j + 1
        hlo_type = parts[i] if i < len(parts) else hlo_type
    return hlo_type


def _stages(
    sequence: Sequence[str],
    op_text: dict[str, str],
    callees: dict[str, list[str]],
    members: dict[str, list[str]],
    stage_rules: Sequence[StageRule] | None,
) -> list[str]:
    direct: dict[str, str | None] = {}

    def of_instruction(name: str, depth: int = 0) -> str | None:
        if name in direct:
            return direct[name]
        direct[name] = None  # guards against cycles
        label = label_op(op_text.get(name, ""), stage_rules) if op_text.get(name) else None
        if label is None and depth < 8:
            votes: collections.Counter[str] = collections.Counter()
            for comp in callees.get(name, ()):
                for inner in members.get(comp, ()):
                    inner_label = of_instruction(inner, depth + 1)
                    if inner_label is not None:
                        votes[inner_label] += 1
            if votes:
                label = votes.most_common(1)[0][0]
        direct[name] = label
        return label

    labels: list[str] = []
    previous = "inputs"
    for name in sequence:
        label = of_instruction(name)
        if label is None:
            label = previous
        labels.append(label)
        previous = label
    return labels


def timeline_from_dump(
    dump_dir: str,
    hlo_text: str | None = None,
    *,
    stage_rules: Sequence[StageRule] | None = None,
    temp_bytes: int | None = None,
    name: str = "",
    unroll_loops: bool = True,
    numbered_loops: Sequence[str] = ("processor",),
) -> Timeline:
    """Builds a `Timeline` from an XLA dump directory (``--xla_dump_to``).

    Args:
      dump_dir: directory holding ``*after_optimizations-live-range.txt`` and
        ``*after_optimizations-buffer-assignment.txt``. Only the files of the module
        `hlo_text` names (its ``HloModule`` line) are read, else those of the dumped
        ``*after_optimizations.txt`` that sorts last; of several dumps of that module
        (XLA numbers modules per process), the one that sorts last.
      hlo_text: optimised HLO text for op_name metadata; defaults to the dumped
        ``*after_optimizations.txt``.
      stage_rules: see `label_op`.
      temp_bytes: the module's temp size, if known (else the largest temp allocation
        found in the buffer assignment). Live bytes are bytes of the temp allocation,
        so a peak above it means the dump is another compile's.
      name: label of the timeline.
      unroll_loops: repeat the body of every while loop with a known trip count once
        per iteration (XLA's schedule holds it once), so that the x axis is execution
        order. Bytes live in every repetition are those XLA planned for the body: its
        buffers are reused by each iteration, and what a loop carries (a scan's
        stacked residuals) is allocated whole before it starts.
      numbered_loops: stages whose points inside the iterations of step loops (scans
        under `gclab.memory.remat.step_scope`) are labelled ``'<stage> step i'`` (and
        ``'backward: <stage> step i'``) when unrolled.

    Returns:
      The timeline.

    Raises:
      FileNotFoundError: if the dump lacks the live-range or buffer-assignment file of
        the module.
      ValueError: if the peak exceeds `temp_bytes` (the dump is not that compile's).
    """

    def newest(pattern: str, module: str | None = None) -> str:
        found = sorted(glob.glob(os.path.join(dump_dir, pattern)))
        if module is not None:
            # XLA names a dump file [<timestamp>.]module_<number>.<module>.<what>; only
            # this module's files are read (another module's would give its timeline).
            own = re.compile(r"(?:^|\.)module_\d+\." + re.escape(module) + r"\.")
            found = [p for p in found if own.search(os.path.basename(p))]
        if not found:
            of = f" of module {module}" if module else ""
            if module is not None and len(module) >= _LONGEST_NAMED_MODULE:
                why = (f"its name has {len(module)} characters, and XLA writes no dump file "
                       "whose name a file system cannot hold: give the function a shorter "
                       "name")
            else:
                why = ("did XLA compile (not hit a cache) with xla_dump_to and "
                       "xla_dump_hlo_as_text?")
            raise FileNotFoundError(f"no {pattern}{of} in {dump_dir}: {why}")
        return found[-1]

    if hlo_text is None:
        with open(newest("*after_optimizations.txt")) as f:
            hlo_text = f.read()
    module = _module_name(hlo_text)
    with open(newest("*after_optimizations-live-range.txt", module)) as f:
        sequence, ranges = _parse_live_range(f.read())
    with open(newest("*after_optimizations-buffer-assignment.txt", module)) as f:
        assignment = f.read()
    values = _parse_buffer_assignment(assignment)
    if temp_bytes is None:
        sizes = [
            int(m.group(2))
            for m in map(_ALLOC_RE.match, assignment.splitlines())
            if m and "preallocated-temp" in m.group(3)
        ]
        temp_bytes = max(sizes, default=0)
    op_text, callees, members = _parse_hlo(hlo_text)
    live = _live_bytes(len(sequence), values, ranges)
    stages = _stages(sequence, op_text, callees, members, stage_rules)
    stage_of = dict(zip(sequence, stages))
    points = np.arange(len(sequence))
    unrolled, loops_note = False, ""
    if unroll_loops:
        trips = _trip_counts(hlo_text)
        loops = _loops(sequence, callees, members, trips)
        step_loops = _step_loops(op_text, trips)
        if loops:
            order = _unroll(0, len(sequence), loops)
            points = np.asarray([i for i, _ in order], dtype=np.int64)
            stages = [_step_label(stages[i], op_text.get(sequence[i], ""), tags, step_loops,
                                  numbered_loops)
                      for i, tags in order]
            live = live[points]
            unrolled = True
        if not any(_NUMBERED_RE.search(label) for label in stages):
            loops_note = _why_not_numbered(hlo_text, sequence, trips, loops, step_loops)
    peak_index = int(np.argmax(live)) if len(live) else 0
    if len(live) and int(live[peak_index]) > temp_bytes:
        # Bytes live are bytes of the temp allocation: more than it holds is another plan.
        raise ValueError(
            f"the dump in {dump_dir} is not this compile's: its peak of "
            f"{int(live[peak_index])} B exceeds temp_bytes={int(temp_bytes)} B")
    peak_values: tuple[LiveValue, ...] = ()
    if len(live):
        point = int(points[peak_index])
        types = _hlo_types(hlo_text)
        at_peak = [(*key.rstrip("}").split("{", 1), size)
                   for key, size in _live_at(point, values, ranges)]
        peak_values = tuple(
            LiveValue(instruction=name, shape=_element_type(types.get(name, ""), index),
                      bytes=size, stage=stage_of.get(name, ""), op_name=op_text.get(name, ""))
            for name, index, size in at_peak)
    return Timeline(
        live_bytes=live,
        stage=np.asarray(stages, dtype=object),
        instruction=np.asarray([sequence[i] for i in points], dtype=object),
        op_name=np.asarray([op_text.get(sequence[i], "") for i in points], dtype=object),
        peak_bytes=int(live[peak_index]) if len(live) else 0,
        peak_index=peak_index,
        temp_bytes=int(temp_bytes),
        name=name,
        unrolled=unrolled,
        peak_values=peak_values,
        loops_note=loops_note,
    )


def require_stage_rules(stage_rules: object, caller: str) -> None:
    """Refuses `stage_rules` that are not None or a sequence of ``(pattern, label)`` pairs
    (a str pattern or a compiled regex, a str label), naming the first bad rule.

    Raises:
      WrongType: in one line that starts with `caller`.
    """
    allowed = "None or a sequence of (pattern, label) pairs: a str or compiled regex, a str"
    if stage_rules is None:
        return
    if isinstance(stage_rules, (str, bytes)) or not isinstance(stage_rules, Sequence):
        raise WrongType(f"{caller} stage_rules is invalid: {allowed}, not {a_kind(stage_rules)}")
    for i, rule in enumerate(stage_rules):
        if (not isinstance(rule, (tuple, list)) or len(rule) != 2
                or not isinstance(rule[0], (str, re.Pattern)) or not isinstance(rule[1], str)):
            text = repr(rule)
            shown = text if len(text) <= 80 else a_kind(rule)
            raise WrongType(f"{caller} stage_rules[{i}]={shown} is invalid: a (pattern, label) "
                            "pair: a str or compiled regex, a str")


def _module_name(hlo_text: str) -> str | None:
    """The name on an HLO text's ``HloModule`` line (XLA's dump files carry it), or None."""
    m = re.search(r"^HloModule\s+([^\s,]+)", hlo_text, re.MULTILINE)
    return m.group(1) if m else None


def memory_timeline(
    fn: Callable[..., Any],
    *args: Any,
    stage_rules: Sequence[StageRule] | None = None,
    static_argnums: Sequence[int] | int = (),
    donate_argnums: Sequence[int] | int = (),
    name: str | None = None,
    keep_dump: str | None = None,
    unroll_loops: bool = True,
    **kwargs: Any,
) -> Timeline:
    """Memory timeline of ``jax.jit(fn)(*args, **kwargs)`` from XLA's buffer assignment.

    Compiles (never runs) `fn` with `plan_only_options`, XLA:CPU's default fusion emitters
    (whatever ``XLA_FLAGS`` say) and, for this compile only, XLA's dump; then reads the
    schedule, live ranges and buffer assignment of the optimised module.

    Args:
      fn: function to analyse (typically a training step or ``jax.grad(loss)``).
      *args: arrays or `jax.ShapeDtypeStruct` pytrees.
      stage_rules: ``(substring or regex, label)`` pairs; see `label_op`.
      static_argnums: passed to `jax.jit`.
      donate_argnums: passed to `jax.jit`.
      name: label for plots (defaults to the function's name).
      keep_dump: if given, the dump is kept under this directory (created if missing), in
        a fresh subfolder ``gclab_xla_dump_*`` per compile (`Timeline.dump_dir`), so
        that compiles and processes sharing `keep_dump` never read each other's files.
      unroll_loops: one repetition of each loop body per iteration, labelled
        ``'processor step i'`` for the processor (see `timeline_from_dump`).
      **kwargs: keyword arguments of `fn`.

    Returns:
      A `Timeline` whose `temp_bytes` comes from the same compilation.

    Raises:
      ValueError: a 64-bit `jax.ShapeDtypeStruct` while JAX's 64-bit mode is off, or a
        negative dimension (`gclab.measure.compiled.require_plannable`); `WrongType` for an
        `fn` not callable or malformed `stage_rules`.
    """
    require_plannable("memory_timeline", fn, args, kwargs)
    require_stage_rules(stage_rules, "memory_timeline")
    return compile_with_timeline(
        fn, *args, stage_rules=stage_rules, static_argnums=static_argnums,
        donate_argnums=donate_argnums, name=name, keep_dump=keep_dump,
        unroll_loops=unroll_loops,
        compiler_options=plan_only_options(platform=target_platform(args, kwargs)), **kwargs,
    )[2]


# A timeline is read with XLA:CPU's default (MLIR) fusion emitters even where `XLA_FLAGS`
# turn them off (as gclab's tests do, to compile faster): under the older elemental emitter
# the dump of the same step lists about a thousand times as many schedule points (cpu-4x32's
# step, `none`: 2.0 million against 2,039), too many to read or draw. The option is XLA:CPU's
# alone, and newer XLA builds no longer have it: jax 0.11.2's refuses a compile that names it
# (INVALID_ARGUMENT, "No such compile option", on an NVIDIA H200), so it is set only for
# compiles that target the CPU, and only where this XLA has it (`timeline_compiler_options`).
TIMELINE_COMPILER_OPTIONS = types.MappingProxyType({"xla_cpu_use_fusion_emitters": True})


def timeline_compiler_options(platform: str) -> dict:
    """The options a timeline's compile adds for `platform` (as `target_platform` names it):
    `TIMELINE_COMPILER_OPTIONS` on ``cpu``, nothing elsewhere."""
    require_kind("platform", platform, str, "a platform name such as 'cpu' or 'gpu'",
                 caller="timeline_compiler_options")
    if platform.lower() != "cpu":
        return {}
    return known_options(TIMELINE_COMPILER_OPTIONS, "cpu")  # an XLA without it: nothing


@contextlib.contextmanager
def without_persistent_cache() -> Iterator[None]:
    """JAX's persistent compilation cache off for the compiles inside.

    A dump (``xla_dump_to``) is written only by a compile that XLA runs; JAX leaves the dump
    options out of its cache key, so with the cache on (``JAX_COMPILATION_CACHE_DIR``) a step
    compiled before, in any process, comes from the cache and writes no dump. JAX decides
    whether a process uses the cache once, so it is asked again on the way in and out
    (`reset_cache` clears only that decision, not the cache's files).
    """
    previous = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", previous)
        reset_cache()


def compile_with_timeline(
    fn: Callable[..., Any],
    *args: Any,
    stage_rules: Sequence[StageRule] | None = None,
    static_argnums: Sequence[int] | int = (),
    donate_argnums: Sequence[int] | int = (),
    name: str | None = None,
    keep_dump: str | None = None,
    unroll_loops: bool = True,
    compiler_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[Any, float, Timeline]:
    """`memory_timeline`, also returning the compiled function and its compile seconds.

    The compiled function (a `jax.stages.Compiled`) can be called with arrays of the
    shapes it was compiled for, so one compile gives the memory figures, the timeline
    and a runnable step. Arguments as `memory_timeline`, plus `compiler_options` (XLA
    options for this compile, added to the dump options).

    Returns:
      ``(compiled, compile_seconds, timeline)``.
    """
    require_plannable("compile_with_timeline", fn, args, kwargs)
    require_stage_rules(stage_rules, "compile_with_timeline")
    if keep_dump is not None:
        require_kind("keep_dump", keep_dump, (str, os.PathLike), "a folder path")
        os.makedirs(keep_dump, exist_ok=True)
    # A fresh folder per compile: XLA numbers modules per process (module_0000.* in each).
    dump_dir = tempfile.mkdtemp(prefix="gclab_xla_dump_", dir=keep_dump)
    # Traced with the arguments' device as JAX's default one, as `compile_train_step` traces
    # for the devices given: what the network decides by the platform it compiles for
    # (bfloat16 scan residuals as bits, XLA:CPU only) follows CPU arrays beside a GPU.
    device = target_device(args, kwargs)
    options = {**(compiler_options or {}), **timeline_compiler_options(platform_of(device)),
               "xla_dump_to": dump_dir, "xla_dump_hlo_as_text": True}
    try:
        with (without_persistent_cache(),  # a cached executable writes no dump
              jax.default_device(device) if device is not None else contextlib.nullcontext()):
            compiled, seconds = compile_timed(
                fn, args, kwargs, static_argnums, donate_argnums, options
            )
        memory = memory_of_compiled(compiled, seconds)
        timeline = timeline_from_dump(
            dump_dir,
            compiled.as_text(),
            stage_rules=stage_rules,
            temp_bytes=memory.temp_bytes,
            name=name if name is not None else getattr(fn, "__name__", "fn"),
            unroll_loops=unroll_loops,
        )
    finally:
        if keep_dump is None:
            shutil.rmtree(dump_dir, ignore_errors=True)
    timeline = dataclasses.replace(
        timeline,
        argument_bytes=memory.argument_bytes,
        output_bytes=memory.output_bytes,
        backend=memory.backend,
        dump_dir=dump_dir if keep_dump is not None else "",
    )
    return compiled, seconds, timeline
