"""Matplotlib figures for the memory instruments, in one consistent style.

Every helper returns a `matplotlib.figure.Figure` (nothing is shown or saved), uses
`STYLE` and a fixed colour per stage (`stage_color`), and labels byte axes in binary
units (KiB, MiB, GiB). Backward stages use a lighter shade of their forward colour.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

from gclab import devices
from gclab.config import WrongType, a_kind, is_number, require_kind
from gclab.geometry.graphs import Graphs
from gclab.geometry.grid_mesh import xyz_to_lat_lon
from gclab.geometry.icosahedral import Multimesh
from gclab.measure.compiled import format_bytes
from gclab.measure.residuals import ARGUMENTS_GROUP
from gclab.measure.timeline import BACKWARD_PREFIX

__all__ = [
    "CARD_GB",
    "FIT_CARDS",
    "STAGE_COLORS",
    "STYLE",
    "bytes_axis",
    "orthographic",
    "plot_graph_neighbourhood",
    "plot_fit_chart",
    "plan_limits_gb",
    "plot_heatmap",
    "plot_layout_memory",
    "plot_stage_memory",
    "plot_multimesh",
    "plot_residuals",
    "plot_timeline",
    "plot_tradeoff",
    "stage_color",
    "style",
]

#: rcParams shared by every figure of the book.
STYLE: dict[str, Any] = {
    "figure.figsize": (8.0, 4.0),
    "figure.dpi": 100,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.labelsize": 10,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "font.size": 9,
}

#: Fixed colour per (forward) stage.
STAGE_COLORS: dict[str, str] = {
    "inputs": "#9e9e9e",
    "encoder": "#1f77b4",
    "processor": "#2ca02c",
    "decoder": "#ff7f0e",
    "loss": "#d62728",
    "optimizer": "#9467bd",
    "other": "#8c564b",
}

#: Printed memory of the cards of the 16, 24, 40 and 80 GB classes (`gclab.devices.CARDS`).
CARD_GB: tuple[int, ...] = (16, 24, 40, 80)
#: The cards the fit charts draw, one per GPU device class up to 80 GB.
FIT_CARDS: tuple[str, ...] = ("T4", "L4", "A100-40GB", "H100")


def plan_limits_gb(names: Sequence[str] = FIT_CARDS) -> dict[str, float]:
    """``{label: GB}`` of what a compiled plan may take on each card, for `plot_fit_chart`.

    The one rule of `gclab.devices`: `FIT_MARGIN` of the card's usable memory (JAX's pool,
    0.75 of the card by default), not the printed size. The value is in GB of 10^9 bytes, as
    `plot_fit_chart` takes it; the label gives the same limit in binary units, as the byte
    axis and the book's prose do (``"H100: 50.29 GiB"``).

    Raises:
      TypeError: `names` is one str (``"H100"``), not a sequence of names (`WrongType`).
    """
    if isinstance(names, str):  # iterated, "H100" would be read as the cards "H", "1", ...
        raise WrongType(f"plan_limits_gb names={names!r} is invalid: a sequence of card names "
                        f"([{names!r}] for one card), not a str")
    out = {}
    for name in names:
        limit = devices.FIT_MARGIN * devices.card_usable_bytes(name)
        out[f"{name}: {format_bytes(limit)}"] = limit / 1e9
    return out


def _require_columns(fn: str, df: object, needed: Mapping[str, str], rows: bool = True
                     ) -> pd.DataFrame:
    """`df` if it is a DataFrame with every column of `needed` (and, where `rows`, a row).

    Args:
      fn: the plotting function, as the message names it.
      df: what was given.
      needed: column -> the argument that names it (``"label"``), or what it holds.
      rows: a frame without rows is refused too (it would draw an empty chart, or fail deep
        inside matplotlib).

    Raises:
      WrongType: `df` not a DataFrame.
      ValueError: ``"<fn>: df has no column 'x' (<argument>); columns: ..."``, or no rows.
    """
    require_kind("df", df, pd.DataFrame, "a pandas DataFrame", fn)
    for column, what in needed.items():
        if column not in df.columns:
            have = ", ".join(map(repr, map(str, df.columns))) or "none"
            raise ValueError(f"{fn}: df has no column {column!r} ({what}); columns: {have}")
    if rows and df.empty:
        raise ValueError(f"{fn}: df has no rows: nothing to draw")
    return df


def _require_finite(fn: str, df: pd.DataFrame, column: str, label: str) -> np.ndarray:
    """`df[column]` as floats, or a ValueError naming the column and the row (by its `label`)
    of the first value that is not a finite number: a NaN bar or point is not drawn, and a
    label placed at it lands at (nan, y)."""
    values = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=float)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{fn}: df[{column!r}] is {_plain(df[column].iloc[i])!r} for {label} "
                         f"{_plain(df[label].iloc[i])!r}: a finite number in every row")
    return values


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds, so that a message shows ``nan``, not
    ``np.float64(nan)``."""
    return value.item() if isinstance(value, np.generic) else value


def _require_number(fn: str, name: str, value: object, optional: bool = False) -> Any:
    """`value` if it is a finite number >= 0 (or None, where `optional`); otherwise one line
    naming `fn` and `name` (`WrongType` for a value that is no number: ``"16GB"``, say)."""
    if optional and value is None:
        return value
    allowed = "a number of bytes >= 0" + (" or None" if optional else "")
    if not is_number(value):
        raise WrongType(f"{fn} {name}={value!r} is invalid: {allowed}, not {a_kind(value)}")
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{fn} {name}={value!r} is invalid: {allowed}")
    return value


_STEP_RE = re.compile(r" step (\d+)$")

_EXTRA = ("#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#98df8a")


@contextlib.contextmanager
def style() -> Iterator[None]:
    """Context manager applying `STYLE` to figures created inside it."""
    with plt.rc_context(STYLE):
        yield


def stage_color(stage: str) -> str:
    """Colour of a stage label (hex); 'backward: X' is a lighter shade of X.

    'processor step i' shares the processor colour; unknown labels get a stable
    colour from a small extra palette.
    """
    backward = stage.startswith(BACKWARD_PREFIX)
    base = stage[len(BACKWARD_PREFIX):] if backward else stage
    if base.startswith("processor"):
        base = "processor"
    if base in STAGE_COLORS:
        color = STAGE_COLORS[base]
    else:
        color = _EXTRA[sum(map(ord, base)) % len(_EXTRA)]
    if backward:
        rgb = np.asarray(mcolors.to_rgb(color))
        color = mcolors.to_hex(rgb + (1.0 - rgb) * 0.5)
    return color


class _BinaryLocator(MaxNLocator):
    """Ticks at round numbers of the binary unit of the axis range (100 MiB, not 95.4)."""

    def tick_values(self, vmin: float, vmax: float) -> np.ndarray:
        top = max(abs(vmin), abs(vmax))
        unit = 1024.0 ** int(np.floor(np.log(top) / np.log(1024.0))) if top >= 1 else 1.0
        return super().tick_values(vmin / unit, vmax / unit) * unit


def _byte_label(v: float, _: Any = None) -> str:
    text = format_bytes(v, 1)
    number, _, unit = text.partition(" ")
    return f"{number.removesuffix('.0')} {unit}"


def bytes_axis(axis: Any) -> None:
    """Formats a matplotlib axis (e.g. ``ax.yaxis``) in KiB/MiB/GiB; on a linear axis,
    ticks fall on round numbers of the unit, on a log axis on powers of 4 (256 MiB, 1 GiB,
    4 GiB, ...) rather than on powers of ten, which no binary unit prints roundly."""
    if axis.get_scale() == "linear":
        axis.set_major_locator(_BinaryLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    elif axis.get_scale() == "log":
        axis.set_major_locator(LogLocator(base=4))
        axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(_byte_label))


def _runs(labels: Sequence[str]) -> list[tuple[str, int, int]]:
    runs: list[tuple[str, int, int]] = []
    start = 0
    for i in range(1, len(labels) + 1):
        if i == len(labels) or labels[i] != labels[start]:
            runs.append((labels[start], start, i))
            start = i
    return runs


def plot_timeline(
    timeline_or_list: Any,
    labels: Sequence[str] | None = None,
    *,
    title: str = "Bytes live over the compiled schedule",
    show_temp: bool = True,
) -> Figure:
    """Memory timeline(s) from `gclab.measure.timeline.memory_timeline`.

    One timeline is drawn filled and coloured by stage (the forward pass rises, the
    backward pass falls), with a dashed line at its `temp_bytes`; the iterations of
    unrolled processor loops (``'processor step i'``) alternate in shade and share one
    legend entry. Several timelines
    are overlaid as lines over the fraction of their schedule (before/after
    comparisons), the first one also filled by stage.

    Args:
      timeline_or_list: a `Timeline` or a sequence of them.
      labels: legend label per timeline (defaults to their names).
      title: axes title.
      show_temp: draw the compiled temp size of each timeline as a dashed line.

    Returns:
      The figure. Axes lines: one per timeline, plus one per timeline if
      `show_temp`; one filled region per contiguous stage run of the first timeline.
    """
    timelines = (
        list(timeline_or_list)
        if isinstance(timeline_or_list, (list, tuple))
        else [timeline_or_list]
    )
    if not timelines:  # nothing to fill or to take the first of
        raise ValueError("plot_timeline: timeline_or_list is empty: a Timeline, or a list of "
                         "one or more")
    if labels is not None and len(labels) != len(timelines):
        raise ValueError(f"plot_timeline: labels has {len(labels)} entries for "
                         f"{len(timelines)} timeline(s): one label per timeline")
    if labels is None:
        labels = [t.name or f"timeline {i}" for i, t in enumerate(timelines)]
    several = len(timelines) > 1
    with style():
        fig, ax = plt.subplots()
        first = timelines[0]
        n = max(len(first), 1)
        x0 = np.arange(len(first)) / (n - 1 if several and n > 1 else 1)
        seen: set[str] = set()
        for stage, a, b in _runs(list(first.stage)):
            stop = min(b + 1, len(first))
            # 'processor step i' runs share one legend entry; odd steps are drawn lighter
            # so that the iterations of an unrolled loop stay visible.
            step = _STEP_RE.search(stage)
            group = stage[: step.start()] if step else stage
            alpha = 0.35 if several else 0.8
            if step and int(step.group(1)) % 2:
                alpha *= 0.6
            ax.fill_between(
                x0[a:stop],
                first.live_bytes[a:stop],
                step="post",
                color=stage_color(stage),
                alpha=alpha,
                linewidth=0,
                label=None if group in seen else group,
            )
            seen.add(group)
        for i, (t, label) in enumerate(zip(timelines, labels, strict=True)):
            m = max(len(t), 1)
            x = np.arange(len(t)) / (m - 1 if several and m > 1 else 1)
            color = "black" if not several else plt.cm.tab10(i % 10)
            ax.step(
                x, t.live_bytes, where="post", color=color, linewidth=1.2,
                label=f"{label} (peak {format_bytes(t.peak_bytes)})",
            )
            if show_temp:
                ax.axhline(t.temp_bytes, color=color, linestyle="--", linewidth=0.8)
        ax.set_xlabel("fraction of schedule" if several else "schedule point")
        ax.set_ylabel("temp bytes live")
        ax.set_ylim(bottom=0)
        bytes_axis(ax.yaxis)
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.set_size_inches(10.0, 4.0)
        fig.tight_layout()
    return fig


def plot_residuals(
    df: pd.DataFrame, *, title: str = "Saved residuals by module",
    include_arguments: bool = True,
) -> Figure:
    """Horizontal bars of residual bytes per module.

    Args:
      df: `gclab.measure.residuals.saved_residuals_df` output (or any frame with ``module``
        and ``bytes`` columns).
      title: axes title.
      include_arguments: keep the 'inputs/params' group.

    Returns:
      The figure, one bar per module.

    Raises:
      ValueError: `df` lacks a ``module`` or ``bytes`` column, or has no rows.
    """
    _require_columns("plot_residuals", df, {"module": "each row's module",
                                            "bytes": "each row's residual bytes"})
    data = df if include_arguments else df[df["module"] != ARGUMENTS_GROUP]
    grouped = data.groupby("module", sort=False)["bytes"].sum().sort_values()
    with style():
        fig, ax = plt.subplots(figsize=(8.0, 0.5 + 0.4 * max(len(grouped), 1)))
        colors = [stage_color(_module_stage(m)) for m in grouped.index]
        bars = ax.barh(list(grouped.index), grouped.to_numpy(), color=colors)
        for bar, value in zip(bars, grouped.to_numpy(), strict=True):
            ax.annotate(
                format_bytes(value, 1), (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                xytext=(3, 0), textcoords="offset points", va="center", fontsize=8,
            )
        bytes_axis(ax.xaxis)
        ax.set_xlabel("bytes saved for the backward pass")
        ax.set_title(title)
        fig.tight_layout()
    return fig


def _module_stage(module: str) -> str:
    if "grid2mesh" in module or "encoder" in module:
        return "encoder"
    if "mesh2grid" in module or "decoder" in module:
        return "decoder"
    if "mesh_gnn" in module or "processor" in module:
        return "processor"
    if module == ARGUMENTS_GROUP:
        return "inputs"
    return "other"


def plot_tradeoff(
    df: pd.DataFrame,
    *,
    x: str = "step_seconds",
    y: str = "peak_bytes",
    recipe: str = "recipe",
    title: str = "Memory vs time per recipe",
) -> Figure:
    """Memory-versus-time scatter, one marker series per recipe.

    Args:
      df: one row per measurement with columns `x` (seconds), `y` (bytes), `recipe`.
      x: time column.
      y: bytes column.
      recipe: recipe-name column.
      title: axes title.

    Returns:
      The figure, one scatter collection per recipe (annotated with its name).

    Raises:
      ValueError: a column missing, no rows, or a value of `x` or `y` that is not a finite
        number (a recipe that did not run: drop its row, as ``dropna`` does).
    """
    fn = "plot_tradeoff"
    _require_columns(fn, df, {x: "x", y: "y", recipe: "recipe"})
    for column in (x, y):
        _require_finite(fn, df, column, recipe)
    with style():
        fig, ax = plt.subplots()
        for i, (name, group) in enumerate(df.groupby(recipe, sort=False)):
            ax.scatter(group[x], group[y], s=40, color=plt.cm.tab10(i % 10), label=str(name))
            ax.annotate(
                str(name), (group[x].iloc[-1], group[y].iloc[-1]),
                xytext=(4, 4), textcoords="offset points", fontsize=8,
            )
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(y.replace("_", " "))
        bytes_axis(ax.yaxis)
        ax.set_ylim(0, 1.15 * float(np.nanmax(df[y])))
        ax.set_xlim(0, 1.15 * float(np.nanmax(df[x])))
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
    return fig


def plot_sweep(df: pd.DataFrame, *, y: str = "total_bytes",
               title: str = "Compiled memory per technique") -> Figure:
    """Bytes against latent x steps, one line per technique (a `gclab.sizing.sweep` frame).

    Args:
      df: rows of `sweep` with `model.latent_size`, `model.processor_steps`, `technique`
        and the bytes column `y`.
      y: bytes column.
      title: axes title.

    Returns:
      The figure, one line per technique.

    Raises:
      ValueError: no row has a finite `y` (a measured sweep has no compiled bytes: its
        column is `peak_bytes`); the chart would be empty, its axis labelled around 0 B.
    """
    if y not in df or not np.isfinite(pd.to_numeric(df[y], errors="coerce")
                                      .to_numpy(dtype=float)).any():
        raise ValueError(f"plot_sweep: no row has a {y} to draw (a measured sweep's bytes are "
                         "in peak_bytes, a compiled one's in total_bytes)")
    with style():
        fig, ax = plt.subplots()
        for label, part in df.groupby("technique", sort=False):
            size = part["model.latent_size"] * part["model.processor_steps"]
            ax.plot(size, part[y], "o-", label=str(label))
        ax.set_xlabel("latent x steps")
        ax.set_ylabel(y.replace("_", " "))
        bytes_axis(ax.yaxis)
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
    return fig


def plot_heatmap(
    df: pd.DataFrame,
    x: str = "latent_size",
    y: str = "processor_steps",
    value: str = "temp_bytes",
    budget_bytes: float | None = None,
    *,
    status: str = "status",
    title: str | None = None,
) -> Figure:
    """Heatmap of a byte count over two configuration axes, out-of-memory marked.

    A cell is out of memory when its `status` column says ``'oom'``, its value is
    missing, or its value exceeds `budget_bytes`; such cells are greyed, hatched and
    labelled "OOM".

    Args:
      df: one row per configuration.
      x: column for the horizontal axis.
      y: column for the vertical axis.
      value: bytes column shown as colour and text.
      budget_bytes: optional memory budget.
      status: optional status column ('ok' / 'oom' / 'error').
      title: axes title (default: the value name).

    Returns:
      The figure (`fig.axes[0].texts` holds one label per cell).

    Raises:
      ValueError: a column missing, no rows, or `budget_bytes` not a number >= 0 (a str
        such as ``"16GB"``: `WrongType`).
    """
    _require_columns("plot_heatmap", df, {x: "x", y: "y", value: "value"})
    _require_number("plot_heatmap", "budget_bytes", budget_bytes, optional=True)
    grid = df.pivot_table(index=y, columns=x, values=value, aggfunc="max", dropna=False)
    oom = pd.DataFrame(False, index=grid.index, columns=grid.columns)
    if status in df.columns:
        flags = df.assign(_oom=df[status].eq("oom")).pivot_table(
            index=y, columns=x, values="_oom", aggfunc="max"
        )
        oom = oom | flags.reindex_like(grid).fillna(False).astype(bool)
    values = grid.to_numpy(dtype=float)
    oom_mask = oom.to_numpy(dtype=bool) | np.isnan(values)
    if budget_bytes is not None:
        oom_mask |= np.nan_to_num(values, nan=0.0) > budget_bytes
    with style():
        fig, ax = plt.subplots(figsize=(1.2 + 1.1 * grid.shape[1], 1.0 + 0.6 * grid.shape[0]))
        shown = np.ma.masked_array(values, mask=oom_mask)
        cmap = plt.get_cmap("viridis").with_extremes(bad="#d9d9d9")
        fits = not bool(oom_mask.all())
        image = ax.imshow(shown, cmap=cmap, aspect="auto", origin="lower",
                          vmin=float(shown.min()) if fits else 0.0,
                          vmax=float(shown.max()) if fits else 1.0)
        for (r, c), v in np.ndenumerate(values):
            if oom_mask[r, c]:
                ax.add_patch(plt.Rectangle(
                    (c - 0.5, r - 0.5), 1, 1, fill=False, hatch="///",
                    edgecolor="#d62728", linewidth=0,
                ))
                text = "OOM" if np.isnan(v) else f"OOM\n{format_bytes(v, 1)}"
                ax.text(c, r, text, ha="center", va="center", color="#d62728", fontsize=8)
            else:
                ax.text(c, r, format_bytes(v, 1), ha="center", va="center", color="white",
                        fontsize=8)
        ax.set_xticks(range(grid.shape[1]), [str(v) for v in grid.columns])
        ax.set_yticks(range(grid.shape[0]), [str(v) for v in grid.index])
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(y.replace("_", " "))
        ax.grid(False)
        if fits:  # a colour scale only where some cell fits
            bar = fig.colorbar(image, ax=ax)
            bytes_axis(bar.ax.yaxis)
        # The cells' precision: a 50.2 GiB cell that fits must not sit under "budget 50 GiB".
        suffix = (f" (budget {format_bytes(budget_bytes, 1)})" if budget_bytes is not None
                  else "")
        ax.set_title((title or value.replace("_", " ")) + suffix)
        fig.tight_layout()
    return fig


def _card_labels(ax: Any, names: Sequence[str], ys: Sequence[float], colors: Any,
                 fontsize: float = 8.0) -> None:
    """Labels the card lines (`ys` ascending, in data units) at the right of `ax`, each at its
    line's height unless it would overlap the label below it: then it moves up just far
    enough. A thin stroke of the line's colour joins each label to its line, so that close
    limits (the T4's and the L4's on an axis that reaches the 0.25 degree step) stay
    readable and each label still points at its own line."""
    lo, hi = ax.get_ylim()
    height = ax.get_position().height * ax.figure.get_figheight() * 72  # axes height, points
    gap = 1.3 * fontsize  # one line of text, in points
    top = None
    for name, y, color in zip(names, ys, colors, strict=True):
        at = (y - lo) / (hi - lo) * height  # the line's height in points above the axes
        spot = at if top is None else max(at, top + gap)
        top = spot
        ax.annotate(
            name, (1.0, y), xycoords=("axes fraction", "data"), xytext=(8, spot - at),
            textcoords="offset points", va="center", fontsize=fontsize, annotation_clip=False,
            arrowprops=dict(arrowstyle="-", color=color, linewidth=0.8, shrinkA=0, shrinkB=1),
        )


def plot_fit_chart(
    df: pd.DataFrame,
    cards: Sequence[float] | Mapping[str, float] = CARD_GB,
    *,
    label: str = "config",
    value: str = "total_bytes",
    title: str = "Does it fit?",
) -> Figure:
    """Bars of memory per configuration with horizontal lines at card limits.

    Args:
      df: one row per configuration with columns `label` and `value` (bytes).
      cards: limits in GB of 10^9 bytes (sequence), or ``{name: GB}``; the book passes
        `plan_limits_gb()`, what a plan may take on each card.
      label: configuration-name column.
      value: bytes column.
      title: axes title.

    Returns:
      The figure: one bar per configuration (coloured by the smallest card it fits)
      and one horizontal line per card.

    Raises:
      ValueError: a column missing, no rows, a `value` that is not a finite number (a NaN
        bar is not drawn, yet would be coloured as fitting no card), or a card limit that is
        not a positive number; `WrongType` where `cards` is no sequence or mapping.
    """
    fn = "plot_fit_chart"
    _require_columns(fn, df, {label: "label", value: "value"})
    _require_finite(fn, df, value, label)
    allowed = "a sequence of GB limits, or a {name: GB} mapping (plan_limits_gb())"
    if isinstance(cards, str) or not isinstance(cards, (Sequence, Mapping)):
        raise WrongType(f"{fn} cards={cards!r} is invalid: {allowed}, not {a_kind(cards)}")
    limits = cards.values() if isinstance(cards, Mapping) else cards
    if not limits or not all(is_number(g) and np.isfinite(g) and g > 0 for g in limits):
        raise ValueError(f"{fn} cards={cards!r} is invalid: {allowed}, each limit a number > 0")
    named = (
        dict(cards) if isinstance(cards, Mapping) else {f"{g:g} GB": float(g) for g in cards}
    )
    sizes = sorted(named.items(), key=lambda kv: kv[1])
    palette = plt.cm.viridis(np.linspace(0.15, 0.85, len(sizes)))
    with style():
        fig, ax = plt.subplots()
        colors = []
        for v in df[value].to_numpy(dtype=float):
            fits = [i for i, (_, g) in enumerate(sizes) if v <= g * 1e9]
            colors.append(palette[fits[0]] if fits else "#d62728")
        ax.bar([str(v) for v in df[label]], df[value].to_numpy(dtype=float), color=colors)
        for (_, gb), color in zip(sizes, palette, strict=True):
            ax.axhline(gb * 1e9, color=color, linestyle="--", linewidth=1.0)
        bytes_axis(ax.yaxis)
        ax.set_ylabel(value.replace("_", " "))
        ax.set_title(title)
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
        fig.tight_layout()  # first, so that the labels are spaced on the final axes height
        _card_labels(ax, [name for name, _ in sizes], [gb * 1e9 for _, gb in sizes], palette)
        fig.tight_layout()  # then again, to make room for them at the right
    return fig


# --------------------------------------------------------------------------- geometry

#: Colour of each multimesh refinement level (level 0 first): one per level of the
#: finest mesh a `gclab.config.ModelConfig` allows (7 splits); a finer mesh repeats them.
LEVEL_COLORS: tuple[str, ...] = ("#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd",
                                 "#8c564b", "#e377c2", "#17becf")


def orthographic(xyz: np.ndarray, lat0: float = 30.0, lon0: float = 20.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An orthographic view of points on the unit sphere, seen from (lat0, lon0).

    Args:
      xyz: [N, 3] unit vectors.
      lat0: latitude of the view point (degrees).
      lon0: longitude of the view point (degrees).

    Returns:
      x, y: [N] coordinates on the picture plane (east, north); visible: [N] bool, True
      on the near hemisphere.
    """
    la, lo = np.deg2rad(lat0), np.deg2rad(lon0)
    east = np.array([-np.sin(lo), np.cos(lo), 0.0])
    north = np.array([-np.sin(la) * np.cos(lo), -np.sin(la) * np.sin(lo), np.cos(la)])
    view = np.array([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)])
    return xyz @ east, xyz @ north, xyz @ view > 0


def plot_multimesh(mesh: Multimesh, *, lat0: float = 30.0, lon0: float = 20.0) -> Figure:
    """Each refinement level of a multimesh on the globe, then all levels together.

    Edges are drawn as straight chords on the near hemisphere of an orthographic view,
    one colour per level (`LEVEL_COLORS`), coarse levels thicker; in the last panel the
    long coarse edges lie on top of the fine ones.

    Args:
      mesh: a multimesh (`gclab.geometry.multimesh`) of any number of splits.
      lat0: latitude of the view point (degrees).
      lon0: longitude of the view point (degrees).

    Returns:
      The figure: one axes per level, then one for the multimesh.
    """
    levels = len(mesh.faces_per_level)
    x, y, visible = orthographic(mesh.vertices, lat0, lon0)
    with style():
        fig, axes = plt.subplots(1, levels + 1, figsize=(4 * (levels + 1), 4))
        for i, ax in enumerate(axes):
            last = min(i, levels - 1)
            first = 0 if i == levels else last
            for level in range(first, last + 1):
                faces = mesh.faces_per_level[level]  # [F, 3]
                s, r = faces.ravel(), np.roll(faces, -1, axis=1).ravel()  # each face's 3 edges
                keep = visible[s] & visible[r]
                ax.plot(np.stack([x[s][keep], x[r][keep]]), np.stack([y[s][keep], y[r][keep]]),
                        color=LEVEL_COLORS[level % len(LEVEL_COLORS)],
                        lw=max(0.4, 1.6 - 0.4 * level))
            ax.add_patch(plt.Circle((0, 0), 1, fill=False, color="grey"))
            ax.axis("off")
            ax.set(aspect="equal", xlim=(-1.05, 1.05), ylim=(-1.05, 1.05),
                   title="multimesh (all levels)" if i == levels else f"level {last}")
    return fig


def _unit_vectors(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """[N, 3] unit vectors of latitudes and longitudes in degrees ([N] each)."""
    la, lo = np.deg2rad(lat), np.deg2rad(lon)
    return np.stack([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)], axis=-1)


def _unit_vector(lat: float, lon: float) -> np.ndarray:
    """[3] unit vector of one latitude and longitude in degrees."""
    return _unit_vectors(np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64))


def _wrap(lon: Any, centre: Any) -> Any:
    """`lon` (degrees) moved by whole turns to within 180 degrees of `centre`."""
    return (lon - centre + 180.0) % 360.0 - 180.0 + centre


def plot_graph_neighbourhood(graphs: Graphs, *, mesh_node_near: tuple[float, float] = (40, 180),
                             grid_node_near: tuple[float, float] = (-20, 200),
                             lon_range: tuple[float, float] = (150, 230),
                             lat_range: tuple[float, float] = (-45, 65)) -> Figure:
    """The grid2mesh edges into one mesh node and the mesh2grid edges into one grid node.

    Args:
      graphs: the built graphs (`gclab.geometry.build_graphs`).
      mesh_node_near: (lat, lon) in degrees; the mesh node nearest to it on the sphere
        (great-circle distance) is the grid2mesh receiver drawn.
      grid_node_near: (lat, lon); the grid node nearest to it is the mesh2grid receiver.
      lon_range: longitudes shown; they may run past 360 (``(300, 420)``) or start below
        0 (``(-60, 60)``) to show a stretch across the 0/360 meridian. Every longitude is
        drawn within 180 degrees of the range's middle, and each edge from its receiver's
        side, so that an edge across the meridian stays short.
      lat_range: latitudes shown.

    Returns:
      The figure: grid nodes (grey), mesh nodes (blue), grid2mesh edges into the mesh node
      (green) and mesh2grid edges into the grid node (red); the title gives both counts.
    """
    mesh_xyz = graphs.mesh_node_xyz.astype(np.float64)  # [Nm, 3]
    mesh_lat, mesh_lon = xyz_to_lat_lon(mesh_xyz)  # [Nm]
    grid_lat = np.repeat(graphs.grid_lat, graphs.n_lon).astype(np.float64)  # [Ng], lat-major
    grid_lon = np.tile(graphs.grid_lon, graphs.n_lat).astype(np.float64)  # [Ng]
    # Nearest on the sphere: degrees of longitude shrink toward the poles and wrap at 360.
    node = int(np.argmax(mesh_xyz @ _unit_vector(*mesh_node_near)))
    cell = int(np.argmax(_unit_vectors(grid_lat, grid_lon) @ _unit_vector(*grid_node_near)))
    g2m = graphs.grid2mesh.senders[graphs.grid2mesh.receivers == node]
    m2g = graphs.mesh2grid.senders[graphs.mesh2grid.receivers == cell]
    middle = (lon_range[0] + lon_range[1]) / 2
    mesh_lon, grid_lon = _wrap(mesh_lon, middle), _wrap(grid_lon, middle)
    with style():
        fig, ax = plt.subplots(figsize=(10, 4.5))
        ax.scatter(grid_lon, grid_lat, s=2, color="lightgrey", label="grid nodes")
        ax.scatter(mesh_lon, mesh_lat, s=6, color="#1f77b4", label="mesh nodes")
        for s in g2m:
            ax.plot([_wrap(grid_lon[s], mesh_lon[node]), mesh_lon[node]],
                    [grid_lat[s], mesh_lat[node]], color="#2ca02c")
        for s in m2g:
            ax.plot([_wrap(mesh_lon[s], grid_lon[cell]), grid_lon[cell]],
                    [mesh_lat[s], grid_lat[cell]], color="#d62728")
        ax.set(xlabel="longitude (deg)", ylabel="latitude (deg)", xlim=lon_range, ylim=lat_range,
               title=f"grid2mesh edges into one mesh node (green: {len(g2m)}), "
                     f"mesh2grid edges into one grid node (red: {len(m2g)})")
        ax.legend(loc="lower left")
    return fig


def plot_layout_memory(df: pd.DataFrame, one_device_temp: float) -> Figure:
    """Per-device temp against device count, one line per layout (chapter 8).

    Args:
      df: rows with columns ``layout``, ``devices`` and ``temp / device`` (bytes).
      one_device_temp: one device's temp, drawn as the 1 / D line an even split would give.

    Returns:
      The figure (log-log axes, devices ticked at powers of two).

    Raises:
      ValueError: a column missing, no rows, a device count or temp that is not a finite
        number, or `one_device_temp` not a number >= 0 (`WrongType` for a str, say).
    """
    fn = "plot_layout_memory"
    _require_columns(fn, df, {"layout": "each row's layout", "devices": "its device count",
                              "temp / device": "its temp bytes per device"})
    for column in ("devices", "temp / device"):
        _require_finite(fn, df, column, "layout")
    _require_number(fn, "one_device_temp", one_device_temp)
    with style():
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for kind, part in df.groupby("layout", sort=False):
            ax.plot(part["devices"], part["temp / device"], "o-", label=kind)
        most = int(df["devices"].max())
        ax.plot([1, most], [one_device_temp, one_device_temp / most], "k:",
                label="1 / D of one device")
        ticks = [2 ** i for i in range(most.bit_length())]
        ax.set(xscale="log", yscale="log", xlabel="devices", ylabel="temp per device",
               title="Per-device temp of one training step, by layout")
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())  # no "3 x 10^0" between the powers of two
        bytes_axis(ax.yaxis)
        ax.legend(fontsize=8)
    return fig


def plot_stage_memory(series: Mapping[str, Sequence[float]], budget: float,
                      title: str = "") -> Figure:
    """Each pipeline stage's memory for several choices side by side, with the budget.

    Args:
      series: choice name -> bytes per stage (every choice has the same stage count).
      budget: the per-stage budget, drawn as a dotted line.
      title: the axes' title.

    Returns:
      The figure: one group of bars per stage.

    Raises:
      ValueError: no choices, choices of different stage counts, or `budget` not a number
        >= 0; `WrongType` where `series` is no mapping.
    """
    allowed = "a {choice name: bytes per stage} mapping"
    require_kind("series", series, Mapping, allowed, "plot_stage_memory")
    if not series:
        raise ValueError(f"plot_stage_memory: series is empty: {allowed} of one choice or more")
    _require_number("plot_stage_memory", "budget", budget)
    counts = {len(v) for v in series.values()}
    if len(counts) != 1:
        raise ValueError(f"every choice needs the same number of stages, got {sorted(counts)}")
    stages = np.arange(counts.pop())
    width = 0.8 / len(series)
    with style():
        fig, ax = plt.subplots(figsize=(7, 3.2))
        for i, (name, values) in enumerate(series.items()):
            ax.bar(stages + (i - (len(series) - 1) / 2) * width, values, width, label=name)
        ax.axhline(budget, color="k", ls=":", label="budget per stage")
        ax.set(xlabel="stage", ylabel="compiled memory", xticks=list(stages), title=title)
        bytes_axis(ax.yaxis)
        ax.legend(fontsize=8)
    return fig


def plot_guarded_heatmap(
    df: pd.DataFrame,
    value: str = "temp_bytes",
    *,
    plan: str = "total_bytes",
    fits: str = "fits",
    x: str = "latent_size",
    y: str = "processor_steps",
    title: str | None = None,
) -> Figure:
    """`plot_heatmap` of a guarded grid: a cell whose plan did not fit says what it needs.

    Such a cell (``fits`` False, as `gclab.notebook.guarded_grid` reports it) is greyed and
    hatched like an out-of-memory cell, and labelled "needs" with its plan (the compiled
    total the guard compared with the usable memory) instead of its `value`, since it was
    compiled but never run.

    Args:
      df: one row per cell, with columns `x`, `y`, `value`, `plan` and `fits`.
      value: bytes column shown as colour and text where the cell fits.
      plan: bytes column the guard compared (shown where the cell does not fit).
      fits: boolean column, whether the plan fitted.
      x: column for the horizontal axis.
      y: column for the vertical axis.
      title: axes title.

    Returns:
      The figure (`fig.axes[0].texts` holds one label per cell).

    Raises:
      ValueError: a column missing or no rows; `WrongType` where `fits` holds anything but
        True and False (a str ``"False"`` or a NaN would read as True: drawn as a cell that
        ran).
    """
    fn = "plot_guarded_heatmap"
    _require_columns(fn, df, {x: "x", y: "y", value: "value", plan: "plan", fits: "fits"})
    flags = df[fits]
    if flags.dtype != bool:
        wrong = [_plain(v) for v in flags if not isinstance(v, (bool, np.bool_))]
        if wrong:
            raise WrongType(f"{fn}: df[{fits!r}] holds {wrong[0]!r}: True or False only "
                            f"(a bool column, as guarded_grid writes it), not {a_kind(wrong[0])}")
    marked = df.assign(status=np.where(df[fits].astype(bool), "ok", "oom"))
    fig = plot_heatmap(marked, x=x, y=y, value=value, status="status", title=title)
    plans = df.pivot_table(index=y, columns=x, values=plan, aggfunc="max")
    for text in fig.axes[0].texts:
        if text.get_text().startswith("OOM"):
            col, row = (int(round(v)) for v in text.get_position())
            text.set_text(f"needs\n{format_bytes(plans.iloc[row, col], 1)}")
    return fig
