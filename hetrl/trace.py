"""Trace: what happened during a run, one schema for the simulator and the real backend.

A trace is a list of spans, each with a kind (``task`` -- a whole task in one iteration,
``tasklet`` -- one replica or pipeline stage's work, ``transfer`` -- bytes moved between devices,
``collective`` -- a collective over a device group, ``fault`` -- an injected event, ``phase`` --
a part of a tasklet, e.g. a generation's prefill and decode), the task and
iteration it belongs to, the devices it occupied and the bytes it moved. Times are seconds from
the start of the run. ``to_chrome`` exports Chrome trace JSON (open it in Perfetto).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hetrl.errors import (
    finite_number,
    integer,
    is_int,
    listing,
    mapping,
    one_of,
    require,
    string,
)

#: Version 2 added the ``phase`` span kind; version 1 traces (without phases) still load.
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
SPAN_KINDS = ("task", "tasklet", "transfer", "collective", "fault", "phase")
#: The phases of a generation tasklet, as ``phase`` spans inside it: ``prefill`` (meta
#: ``sequences``, ``prompt_tokens``) then ``decode`` (meta ``steps``, ``tokens``, ``batch``).
GENERATION_PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class Span:
    name: str
    kind: str
    task: str
    iteration: int
    start_s: float
    end_s: float
    devices: tuple[int, ...] = ()
    bytes: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "kind": self.kind, "task": self.task,
               "iteration": self.iteration, "start_s": self.start_s, "end_s": self.end_s,
               "devices": list(self.devices), "bytes": self.bytes}
        if self.meta:
            out["meta"] = dict(self.meta)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], field_name: str = "span") -> Span:
        f = field_name
        require(isinstance(d, Mapping), f, d, "must be a mapping")
        known = set(cls.__dataclass_fields__)
        for key in d:
            require(key in known, f"{f}.{key}", d[key], f"unknown key; known keys: {sorted(known)}")
        for key in ("name", "kind", "task", "iteration", "start_s", "end_s"):
            require(key in d, f"{f}.{key}", None, "is required")
        start = finite_number(f"{f}.start_s", d["start_s"], unit="seconds")
        end = finite_number(f"{f}.end_s", d["end_s"], lo=start, unit="seconds (>= start_s)")
        devices = d.get("devices", [])
        require(isinstance(devices, list | tuple) and all(is_int(x) and x >= 0 for x in devices),
                f"{f}.devices", devices, "must be a list of device ids")
        meta = {} if d.get("meta") is None else d["meta"]
        return cls(string(f"{f}.name", d["name"], nonempty=False), one_of(f"{f}.kind", d["kind"], SPAN_KINDS),
                   string(f"{f}.task", d["task"], nonempty=False), integer(f"{f}.iteration", d["iteration"], lo=0),
                   start, end, tuple(devices),
                   finite_number(f"{f}.bytes", d.get("bytes", 0.0), lo=0, unit="bytes"),
                   dict(mapping(f"{f}.meta", meta)))


def task_spans(spans: Iterable[Span]) -> list[Span]:
    """One ``task`` span per (task, iteration) of ``spans`` (a real run's tasklets, transfers and
    collectives), ordered by start. Its time bounds are those of all the task's spans, its input
    transfers included; its devices those of its own work only -- its tasklets and collectives,
    not the source devices of its input transfers, which belong to other tasks. A task made of
    transfers alone (a weight sync) occupies the devices of its transfers."""
    bounds: dict[tuple[str, int], list[float]] = {}
    work: dict[tuple[str, int], set[int]] = {}
    moved: dict[tuple[str, int], set[int]] = {}
    for s in spans:
        if s.kind in ("task", "phase"):  # a phase lies inside its tasklet
            continue
        key = (s.task, s.iteration)
        b = bounds.setdefault(key, [s.start_s, s.end_s])
        b[0], b[1] = min(b[0], s.start_s), max(b[1], s.end_s)
        (moved if s.kind == "transfer" else work).setdefault(key, set()).update(s.devices)
    return [Span(task, "task", task, it, a, b, tuple(sorted(work.get((task, it))
                                                           or moved.get((task, it), ()))))
            for (task, it), (a, b) in sorted(bounds.items(), key=lambda kv: kv[1][0])]


@dataclass(frozen=True)
class Trace:
    """Spans of a run plus its iteration boundaries: ``iterations[i]`` = (start_s, end_s)."""

    source: str  # "sim" or "real"
    workload: str
    cluster: str
    spans: tuple[Span, ...]
    iterations: tuple[tuple[float, float], ...]
    meta: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    # --- views ---
    def iteration_seconds(self) -> list[float]:
        return [end - start for start, end in self.iterations]

    def task_seconds(self, skip_first: bool = True) -> dict[str, float]:
        """Mean seconds per task over iterations (after the first when there are several);
        spans of iterations cut short by a fault (meta ``aborted``) are left out."""
        per: dict[str, dict[int, float]] = {}
        for s in self.spans:
            if s.kind == "task" and not s.meta.get("aborted"):
                it = per.setdefault(s.task, {})
                it[s.iteration] = it.get(s.iteration, 0.0) + s.duration_s
        n = len(self.iterations)
        first = 1 if skip_first and n > 1 else 0
        out = {}
        for task, by_it in per.items():
            vals = [v for i, v in by_it.items() if i >= first]
            out[task] = sum(vals) / len(vals) if vals else 0.0
        return out

    def phase_seconds(self, task: str, skip_first: bool = True) -> dict[str, float]:
        """Mean seconds per phase of ``task`` over iterations (after the first when there are
        several; iterations cut short by a fault left out): per iteration the longest span of
        each phase name over the task's replicas (the slowest replica sets a task's time).
        Empty when the trace has no ``phase`` spans for ``task``."""
        per: dict[str, dict[int, float]] = {}
        aborted = {s.iteration for s in self.spans if s.kind == "task" and s.task == task
                   and s.meta.get("aborted")}
        for s in self.spans:
            if s.kind == "phase" and s.task == task and s.iteration not in aborted:
                it = per.setdefault(s.name, {})
                it[s.iteration] = max(it.get(s.iteration, 0.0), s.duration_s)
        first = 1 if skip_first and len(self.iterations) > 1 else 0
        out = {}
        for name, by_it in per.items():
            vals = [v for i, v in by_it.items() if i >= first]
            if vals:
                out[name] = sum(vals) / len(vals)
        return out

    def spans_of(self, kind: str | None = None, task: str | None = None) -> list[Span]:
        return [s for s in self.spans if (kind is None or s.kind == kind)
                and (task is None or s.task == task)]

    # --- serialisation ---
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "source": self.source,
                "workload": self.workload, "cluster": self.cluster,
                "iterations": [list(x) for x in self.iterations], "meta": dict(self.meta),
                "spans": [s.to_dict() for s in self.spans]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trace:
        require(isinstance(d, Mapping), "trace", type(d).__name__, "must be a mapping")
        version = d.get("schema_version", SCHEMA_VERSION)
        require(is_int(version) and version in READABLE_VERSIONS, "trace.schema_version", version,
                f"this hetrl reads trace versions {list(READABLE_VERSIONS)}")
        known = {"schema_version", "source", "workload", "cluster", "spans", "iterations", "meta"}
        for key in d:
            require(key in known, f"trace.{key}", d[key], f"unknown key; known keys: {sorted(known)}")
        for key in ("source", "workload", "cluster", "spans", "iterations"):
            require(key in d, f"trace.{key}", None, "is required")
        listing("trace.iterations", d["iterations"], "must be a list of [start_s, end_s] pairs")
        iterations = []
        for i, pair in enumerate(d["iterations"]):
            f = f"trace.iterations[{i}]"
            require(isinstance(pair, list | tuple) and len(pair) == 2, f, pair,
                    "must be a [start_s, end_s] pair")
            start = finite_number(f"{f}[0]", pair[0], unit="seconds")
            iterations.append((start, finite_number(f"{f}[1]", pair[1], lo=start,
                                                    unit="seconds (>= start_s): a duration >= 0")))
        listing("trace.spans", d["spans"], "must be a list of spans")
        meta = {} if d.get("meta") is None else d["meta"]
        spans = tuple(Span.from_dict(s, f"trace.spans[{i}]") for i, s in enumerate(d["spans"]))
        for i, s in enumerate(spans):
            require(version >= 2 or s.kind != "phase", f"trace.spans[{i}].kind", s.kind,
                    "phase spans need trace schema_version 2")
        return cls(string("trace.source", d["source"], nonempty=False),
                   string("trace.workload", d["workload"], nonempty=False),
                   string("trace.cluster", d["cluster"], nonempty=False),
                   spans, tuple(iterations), dict(mapping("trace.meta", meta)), version)

    def to_chrome(self) -> dict[str, Any]:
        """Chrome trace events: one process per device ("pid"), one thread per span kind."""
        events: list[dict[str, Any]] = []
        for s in self.spans:
            devices: Iterable[int] = s.devices or (-1,)
            for d in devices:
                events.append({
                    "name": s.name, "cat": s.kind, "ph": "X", "ts": s.start_s * 1e6,
                    "dur": max(s.duration_s, 0.0) * 1e6, "pid": d, "tid": s.kind,
                    "args": {"task": s.task, "iteration": s.iteration, "bytes": s.bytes,
                             **{k: v for k, v in s.meta.items() if isinstance(v, str | int | float)}},
                })
        meta = [{"name": "process_name", "ph": "M", "pid": d, "args": {"name": f"device {d}" if d >= 0
                 else "run"}} for d in sorted({e["pid"] for e in events})]
        return {"traceEvents": meta + events, "displayTimeUnit": "ms",
                "otherData": {"source": self.source, "workload": self.workload,
                              "cluster": self.cluster}}
