"""Role timelines of the persistent kernels (paper Figure 4).

Kernels built with ``-DKOSMOS_TRACE`` record what every CTA does
(``kernels/include/kosmos/trace.h``). Each record is one span of one CTA, 24
bytes, little-endian, no padding (``RECORD_DTYPE``)::

    offset  field     type    meaning
    0       start_ns  uint64  span start, device clock in ns (now_ns())
    8       end_ns    uint64  span end (>= start_ns)
    16      tile      int32   queue index of the work item, -1 for none
    20      cta       uint16  CTA (block) index
    22      rank      uint8   rank of the device in its group
    23      role      uint8   ROLE_NAMES index: build, move, reduce, wait, idle

Device memory holds ``cap`` records per CTA plus one count per CTA (the count
keeps growing past ``cap``; the excess was dropped). ``records_from_buffer``
flattens that into one record array; ``to_chrome_trace`` makes a Chrome-trace /
Perfetto JSON object ("traceEvents": one process per rank, one thread row per
CTA); ``plot_timeline`` draws a PNG (x = time, y = CTA, colour = role).

``capture(fn, *args)`` runs one call with recording on for every local GPU and
returns its records; it needs the extension built with ``KOSMOS_TRACE=ON``
(``pip install --no-build-isolation -e . -Ccmake.define.KOSMOS_TRACE=ON``), and
raises NotImplementedError otherwise. The fused kernels record: movers' copies
(move) and the waits for a peer's row (wait); Hopper AG builders one build span
per CTA plus each wait for a tile's rows (tile = engine tile row); Hopper RS
builders four spans per tile (mainloop = build, retiring the previous tile's
copies and staging = wait, push_fold's combine = reduce, issuing the copies =
idle; tile = engine tile row << 12 | column) plus the fold's waits for a band;
portable builders one build span per CTA (AG's plus each wait for a tile's rows,
tile = engine tile row); reducers one span per slice and their waits.

Clocks of different GPUs are not synchronised exactly (%globaltimer is per
device), so spans of different ranks line up only to within their clock skew;
``per_rank_origin=True`` starts every rank at 0 instead of one shared origin.
matplotlib is imported only by ``plot_timeline`` (optional ``bench`` extra).
"""
from __future__ import annotations

import json
import os

import numpy as np

RECORD_DTYPE = np.dtype([("start_ns", "<u8"), ("end_ns", "<u8"), ("tile", "<i4"),
                         ("cta", "<u2"), ("rank", "u1"), ("role", "u1")])
assert RECORD_DTYPE.itemsize == 24  # kosmos::TraceRecord

ROLE_NAMES = ("build", "move", "reduce", "wait", "idle")  # kTraceBuild... in trace.h
# Working roles dark, waiting light (as in the paper's Figure 4).
ROLE_COLORS = ("#1f4e9c", "#e07b00", "#2a9d3c", "#a9c8ef", "#d9d9d9")


def as_records(data) -> np.ndarray:
  """Views raw bytes, a uint8 array or a structured array as RECORD_DTYPE records."""
  if isinstance(data, np.ndarray) and data.dtype == RECORD_DTYPE:
    return data.reshape(-1)
  if isinstance(data, np.ndarray) and data.dtype.names is not None:
    raise ValueError(f"record array has dtype {data.dtype}, expected {RECORD_DTYPE}")
  raw = np.ascontiguousarray(np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray)
                             else data.view(np.uint8).reshape(-1))
  if raw.size % RECORD_DTYPE.itemsize:
    raise ValueError(f"{raw.size} bytes is not a whole number of {RECORD_DTYPE.itemsize}-byte records")
  return raw.view(RECORD_DTYPE)


def records_from_buffer(records, counts, cap: int) -> tuple[np.ndarray, int]:
  """Flattens per-CTA record lists (CTA c owns records[c*cap:(c+1)*cap], counts[c]
  appends) into one array; returns (records, number dropped for lack of space)."""
  recs = as_records(records)
  counts = np.asarray(counts, dtype=np.int64).reshape(-1)
  if recs.size < counts.size * cap:
    raise ValueError(f"{recs.size} records for {counts.size} CTAs x cap {cap}")
  kept = np.minimum(counts, cap)
  parts = [recs[c * cap: c * cap + int(n)] for c, n in enumerate(kept)]
  out = np.concatenate(parts) if parts else np.zeros(0, RECORD_DTYPE)
  return out, int((counts - kept).sum())


def traced_module():
  """The extension module, if its kernels record timelines; else NotImplementedError."""
  from kosmos_jax import _ext
  mod, why = _ext._module()
  if mod is None or not hasattr(mod, "trace_compiled"):
    raise NotImplementedError(f"role timelines need the CUDA extension: {why or 'built without CUDA'}")
  if not mod.trace_compiled():
    raise NotImplementedError("the kernels were built without KOSMOS_TRACE: rebuild with "
                              "`pip install --no-build-isolation -e . -Ccmake.define.KOSMOS_TRACE=ON`")
  return mod


def capture(fn, *args, cap: int = 4096):
  """(fn(*args), records, dropped): one call with role recording on every local GPU.

  `cap` records are kept per CTA per device (the rest are counted in `dropped`).
  Every kernel launch of the call appends to the same lists, so capture a single
  step. Synchronises the devices before and after."""
  import jax

  from kosmos_jax import runtime
  mod = traced_module()
  if not isinstance(cap, int) or cap < 1:
    raise ValueError(f"capture: cap={cap!r} must be a positive int")
  runtime.init()
  ordinals = [d.local_hardware_id for d in jax.local_devices() if d.platform == "gpu"]
  for o in ordinals:
    mod.trace_enable(o, cap)
  try:
    out = jax.block_until_ready(fn(*args))
  finally:
    for o in ordinals:
      mod.trace_disable(o)
  parts, dropped = [], 0
  for o in ordinals:
    raw, counts, c = mod.trace_read(o)
    recs, lost = records_from_buffer(raw, np.frombuffer(counts, np.uint32), int(c))
    parts.append(recs)
    dropped += lost
  return out, np.concatenate(parts) if parts else np.zeros(0, RECORD_DTYPE), dropped


def _checked(records) -> np.ndarray:
  recs = as_records(records)
  bad = np.nonzero(recs["end_ns"] < recs["start_ns"])[0]
  if bad.size:
    raise ValueError(f"{bad.size} records end before they start (first: index {bad[0]})")
  return recs


def _role_name(role: int, role_names) -> str:
  return role_names[role] if role < len(role_names) else f"role{role}"


def _origins(recs: np.ndarray, per_rank_origin: bool) -> np.ndarray:
  """Time origin (ns) of each record: the earliest start overall or of its rank."""
  if recs.size == 0:
    return np.zeros(0, np.uint64)
  if not per_rank_origin:
    return np.full(recs.size, recs["start_ns"].min(), np.uint64)
  first = {int(r): recs["start_ns"][recs["rank"] == r].min() for r in np.unique(recs["rank"])}
  return np.array([first[int(r)] for r in recs["rank"]], np.uint64)


def to_chrome_trace(records, *, role_names=ROLE_NAMES, per_rank_origin: bool = False) -> dict:
  """Chrome-trace JSON object: pid = rank, tid = CTA, one complete ("X") event per
  record, ts/dur in microseconds from the origin; events sorted by (pid, tid, ts)."""
  recs = _checked(records)
  order = np.lexsort((recs["start_ns"], recs["cta"], recs["rank"]))
  recs = recs[order]
  t0 = _origins(recs, per_rank_origin)
  events = []
  for rank in np.unique(recs["rank"]).tolist():
    events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
    events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for cta in np.unique(recs["cta"][recs["rank"] == rank]).tolist():
      events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": cta, "args": {"name": f"CTA {cta}"}})
      events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": cta, "args": {"sort_index": cta}})
  # Subtract in integers first: ns since boot do not fit a float's 53 bits exactly.
  ts_ns = (recs["start_ns"] - t0).astype(np.int64)
  dur_ns = (recs["end_ns"] - recs["start_ns"]).astype(np.int64)
  for rec, ts, dur in zip(recs.tolist(), ts_ns.tolist(), dur_ns.tolist()):
    _, _, tile, cta, rank, role = rec
    ev = {"name": _role_name(role, role_names), "cat": "kosmos", "ph": "X", "pid": rank, "tid": cta,
          "ts": ts / 1000.0, "dur": dur / 1000.0, "args": {"role": role}}
    if tile >= 0:
      ev["args"]["tile"] = tile
    events.append(ev)
  return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_chrome_trace(records, path: str | os.PathLike, **kw) -> str:
  """Writes to_chrome_trace(records) to `path` (open it in chrome://tracing or Perfetto)."""
  with open(path, "w") as f:
    json.dump(to_chrome_trace(records, **kw), f)
  return os.fspath(path)


def plot_timeline(records, path: str | os.PathLike, *, title: str | None = None, role_names=ROLE_NAMES,
                  role_colors=ROLE_COLORS, per_rank_origin: bool = False) -> str:
  """Draws the timeline as a PNG: one row per (rank, CTA), rank-major, x in us."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # optional: the bench extra
  from matplotlib.collections import PolyCollection
  from matplotlib.figure import Figure
  from matplotlib.patches import Patch

  recs = _checked(records)
  t0 = _origins(recs, per_rank_origin)
  rows = sorted({(int(r), int(c)) for r, c in zip(recs["rank"], recs["cta"])})
  row_of = {rc: i for i, rc in enumerate(rows)}
  # Thin rows on big grids (2 x 132 CTAs): the figure stays one page tall.
  fig = Figure(figsize=(10, min(14.0, max(2.0, 0.18 * len(rows) + 1.2))))
  FigureCanvasAgg(fig)  # the Agg canvas, without pyplot's global state
  ax = fig.add_subplot(1, 1, 1)
  start_us = (recs["start_ns"] - t0).astype(np.int64) / 1000.0
  dur_us = (recs["end_ns"] - recs["start_ns"]).astype(np.int64) / 1000.0
  y = np.array([row_of[(int(r), int(c))] for r, c in zip(recs["rank"], recs["cta"])], dtype=np.int64)
  present = sorted(set(recs["role"].tolist()))
  # One collection of rectangles per role, not a patch per span: a training step's
  # two launches on 132 CTAs record ~10^5-10^6 spans; ax.barh took 139 s for 10^5 here,
  # a collection 11 s for 6 x 10^5.
  for role in present:
    sel = np.nonzero(recs["role"] == role)[0]
    color = role_colors[role] if role < len(role_colors) else "#7f7f7f"
    x0, x1, yc = start_us[sel], start_us[sel] + dur_us[sel], y[sel].astype(np.float64)
    verts = np.stack([np.stack([x0, yc - 0.4], 1), np.stack([x1, yc - 0.4], 1),
                      np.stack([x1, yc + 0.4], 1), np.stack([x0, yc + 0.4], 1)], 1)  # [n, 4, 2]
    ax.add_collection(PolyCollection(verts, facecolors=color, edgecolors="none", linewidths=0))
  if recs.size:
    ax.set_xlim(0.0, float((start_us + dur_us).max()) * 1.01 or 1.0)
  ax.set_ylim(len(rows) - 0.5, -0.5)  # rank 0 CTA 0 on top
  step = max(1, len(rows) // 40)  # keep tick labels legible on big grids
  ax.set_yticks(range(0, len(rows), step))
  ax.set_yticklabels([f"r{r} c{c}" for r, c in rows[::step]], fontsize=7)
  ax.set_xlabel("time (us)")
  ax.set_ylabel("CTA")
  if title:
    ax.set_title(title)
  ax.legend(handles=[Patch(color=role_colors[r] if r < len(role_colors) else "#7f7f7f",
                           label=_role_name(r, role_names)) for r in present],
            loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)  # off the bars
  fig.tight_layout()
  fig.savefig(os.fspath(path), dpi=120)
  return os.fspath(path)
