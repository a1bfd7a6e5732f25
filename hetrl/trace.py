"""Trace: what happened during a run, one schema for the simulator and the real backend.

A trace is a list of spans, each with a kind (``task`` -- a whole task in one iteration,
``tasklet`` -- one replica or pipeline stage's work, ``transfer`` -- bytes moved between devices,
``collective`` -- a collective over a device group, ``fault`` -- an injected event), the task and
iteration it belongs to, the devices it occupied and the bytes it moved. Times are seconds from
the start of the run. ``to_chrome`` exports Chrome trace JSON (open it in Perfetto).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hetrl.errors import SpecError, require

SCHEMA_VERSION = 1
SPAN_KINDS = ("task", "tasklet", "transfer", "collective", "fault")


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
        for key in ("name", "kind", "task", "iteration", "start_s", "end_s"):
            require(key in d, f"{field_name}.{key}", None, "is required")
        require(d["kind"] in SPAN_KINDS, f"{field_name}.kind", d["kind"],
                f"must be one of {list(SPAN_KINDS)}")
        return cls(str(d["name"]), str(d["kind"]), str(d["task"]), int(d["iteration"]),
                   float(d["start_s"]), float(d["end_s"]), tuple(int(x) for x in d.get("devices", [])),
                   float(d.get("bytes", 0.0)), dict(d.get("meta") or {}))


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
        require(version == SCHEMA_VERSION, "trace.schema_version", version,
                f"this hetrl reads trace version {SCHEMA_VERSION}")
        for key in ("source", "workload", "cluster", "spans", "iterations"):
            require(key in d, f"trace.{key}", None, "is required")
        try:
            iterations = tuple((float(a), float(b)) for a, b in d["iterations"])
        except (TypeError, ValueError):
            raise SpecError("trace.iterations", d["iterations"], "must be [start_s, end_s] pairs") from None
        return cls(str(d["source"]), str(d["workload"]), str(d["cluster"]),
                   tuple(Span.from_dict(s, f"trace.spans[{i}]") for i, s in enumerate(d["spans"])),
                   iterations, dict(d.get("meta") or {}), version)

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
