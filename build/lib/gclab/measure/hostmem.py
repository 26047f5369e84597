"""Host (CPU RAM) memory of a block of code, for notebooks, with memray.

memray's own notebook magic renders an HTML flame graph that loads scripts from the
internet; this helper avoids it: it runs `memray.Tracker` into a temporary file, reads
it back with `memray.FileReader` and returns plain pandas/NumPy data, which
`gclab.plots` (or anything else) can draw.

Example::

    with track_host_memory() as host:
        batch = load_batch()
    host.peak_bytes          # exact peak heap during the block (memray's metadata)
    host.snapshots           # DataFrame: time_s, heap_bytes, rss_bytes (~10 ms apart)
    host.top_allocations()   # where the bytes live at the peak

Notes:
  The peak is exact (memray tracks every allocation); the snapshots are sampled by
  memray's background thread about every 10 ms, so a short-lived spike may be
  missing from `snapshots` while still counted in `peak_bytes`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator

import memray
import pandas as pd

__all__ = ["HostMemory", "track_host_memory"]


@dataclasses.dataclass
class HostMemory:
    """Result of `track_host_memory`, filled in when the block exits.

    Attributes:
      peak_bytes: peak heap bytes during the block (exact).
      snapshots: DataFrame with columns ``time_s`` (seconds since the start),
        ``heap_bytes`` and ``rss_bytes``.
      total_allocations: number of allocations memray saw.
      duration_s: wall time of the block.
    """

    peak_bytes: int = 0
    snapshots: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=["time_s", "heap_bytes", "rss_bytes"])
    )
    total_allocations: int = 0
    duration_s: float = 0.0
    _records: list[tuple[str, int, int]] = dataclasses.field(default_factory=list, repr=False)

    @property
    def peak_rss_bytes(self) -> int:
        """Largest sampled resident set size (0 if no snapshot)."""
        return int(self.snapshots["rss_bytes"].max()) if len(self.snapshots) else 0

    def top_allocations(self, n: int = 10) -> pd.DataFrame:
        """Largest allocation sites alive at the peak.

        Args:
          n: number of rows.

        Returns:
          DataFrame with columns ``location``, ``bytes``, ``allocations``.
        """
        df = pd.DataFrame(self._records, columns=["location", "bytes", "allocations"])
        if df.empty:
            return df
        df = df.groupby("location", as_index=False).sum()
        return df.sort_values("bytes", ascending=False).head(n).reset_index(drop=True)


def _location(record: memray.AllocationRecord) -> str:
    try:
        stack = record.stack_trace(max_stacks=1)
    except Exception:  # noqa: BLE001 - no Python frame recorded
        stack = []
    if not stack:
        return "(native / unknown)"
    function, filename, line = stack[0]
    return f"{function} ({os.path.basename(filename)}:{line})"


@contextlib.contextmanager
def track_host_memory(
    *, native_traces: bool = False, keep_file: str | None = None
) -> Iterator[HostMemory]:
    """Tracks host memory allocations of the enclosed block with memray.

    Args:
      native_traces: also record native (C/C++) stacks (slower).
      keep_file: if given, the memray capture file is written there and kept (for
        the memray CLI); else a temporary file is used and removed.

    Yields:
      A `HostMemory` that is filled in when the block exits.
    """
    result = HostMemory()
    tmpdir = None
    if keep_file is None:
        tmpdir = tempfile.mkdtemp(prefix="gclab_memray_")
        path = os.path.join(tmpdir, "capture.bin")
    else:
        path = keep_file
        if os.path.exists(path):
            os.remove(path)
    try:
        with memray.Tracker(path, native_traces=native_traces, follow_fork=False):
            yield result
        reader = memray.FileReader(path)
        meta = reader.metadata
        result.peak_bytes = int(meta.peak_memory)
        result.total_allocations = int(meta.total_allocations)
        result.duration_s = (meta.end_time - meta.start_time).total_seconds()
        snaps = list(reader.get_memory_snapshots())
        if snaps:
            t0 = snaps[0].time
            result.snapshots = pd.DataFrame(
                {
                    "time_s": [(s.time - t0) / 1000.0 for s in snaps],
                    "heap_bytes": [int(s.heap) for s in snaps],
                    "rss_bytes": [int(s.rss) for s in snaps],
                }
            )
        try:
            records = reader.get_high_watermark_allocation_records(merge_threads=True)
            result._records = [
                (_location(r), int(r.size), int(r.n_allocations)) for r in records
            ]
        except Exception:  # noqa: BLE001 - the breakdown is optional
            result._records = []
        reader.close()
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
