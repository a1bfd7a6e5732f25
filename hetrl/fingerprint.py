"""Fingerprints: what a plan is for.

A fingerprint is the first :data:`FINGERPRINT_CHARS` hex digits of the SHA-256 of a spec's
canonical JSON (sorted keys, no spaces, integral floats as integers, other floats as Python's
shortest repr): the same in every process and Python version, blind to YAML layout, comments
and key order. What goes in (docs/specs.md, "What a plan is for"):

- a cluster: per node in order its GPU type, GPU count, region, zone, NIC and edge flag; the
  custom GPU types the nodes use; the links between the regions used; the network constants.
  Not its name, its node names nor its prices (a new price list is the same fleet);
- a workload: every field of the resolved spec (models, algorithm and tasks, batch, lengths,
  micro-batches, precision, mode, ...) except its name.

A plan file records them under ``made_for`` (:class:`MadeFor`); :func:`check_plan_for`
refuses a plan made for another workload or cluster.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hetrl.errors import PlanMismatchError, require, string
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.hardware import gpu_type
from hetrl.spec.workload import WorkloadSpec

#: Hex digits kept of the SHA-256 (64 bits: a collision between two specs is not a concern).
FINGERPRINT_CHARS = 16
#: Bumped if the canonical forms below change (it is hashed with them).
CANONICAL_VERSION = 1


def _canonical(value: Any) -> Any:
    """``value`` with tuples as lists and every integral finite float as an int (``100`` and
    ``100.0`` in a YAML file are one value); non-finite floats as strings."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        return int(value) if value.is_integer() and abs(value) < 2 ** 53 else value
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [_canonical(v) for v in value]
    raise TypeError(f"cannot fingerprint a {type(value).__name__}")


def canonical_json(data: Any) -> str:
    """``data`` as canonical JSON: sorted keys, no whitespace, ASCII."""
    return json.dumps(_canonical(data), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def _digest(kind: str, form: Any) -> str:
    text = canonical_json({"kind": kind, "version": CANONICAL_VERSION, "spec": form})
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:FINGERPRINT_CHARS]


def cluster_form(cluster: ClusterSpec) -> dict[str, Any]:
    """What of ``cluster`` a plan depends on (see the module docstring)."""
    nodes, used_types, regions = [], {}, set()
    for n in cluster.nodes:
        gpu = gpu_type(n.gpu, cluster.gpu_types)
        custom = next((g for g in cluster.gpu_types if g.name == gpu.name), None)
        if custom is not None:
            used_types[custom.name] = custom.to_dict()
        regions.add(n.region)
        nodes.append({"gpu": gpu.name, "count": n.count, "region": n.region, "zone": n.zone,
                      "nic_gbps": cluster.node_nic_gbps(n), "edge": n.edge})
    links = []
    for link in cluster.region_links:
        if link.a in regions and link.b in regions:
            a, b = sorted((link.a, link.b))
            links.append({**asdict(link), "a": a, "b": b})
    links.sort(key=lambda lk: (lk["a"], lk["b"], canonical_json(lk)))
    return {"nodes": nodes, "gpu_types": [used_types[k] for k in sorted(used_types)],
            "region_links": links, "network": asdict(cluster.network)}


def workload_form(workload: WorkloadSpec) -> dict[str, Any]:
    """What of ``workload`` a plan depends on: the resolved spec but its name (and the file
    version it was read from: its defaults are resolved into the other fields)."""
    data = workload.to_dict()
    for key in ("name", "schema_version"):
        data.pop(key, None)
    data["backends"] = sorted(data.get("backends", ()))
    return data


def cluster_fingerprint(cluster: ClusterSpec) -> str:
    """The cluster's fingerprint: :data:`FINGERPRINT_CHARS` hex digits."""
    return _digest("cluster", cluster_form(cluster))


def workload_fingerprint(workload: WorkloadSpec) -> str:
    """The workload's fingerprint: :data:`FINGERPRINT_CHARS` hex digits."""
    return _digest("workload", workload_form(workload))


@dataclass(frozen=True)
class SpecMark:
    """One spec a plan is for: a human name (a preset or file name) and its fingerprint."""

    name: str
    fingerprint: str

    def __str__(self) -> str:
        return f"{self.name!r} (fingerprint {self.fingerprint})"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, data: Any, field: str) -> SpecMark:
        require(isinstance(data, Mapping) and set(data) == {"name", "fingerprint"}, field, data,
                "must be a mapping with exactly 'name' and 'fingerprint'")
        fp = data["fingerprint"]
        require(isinstance(fp, str) and len(fp) == FINGERPRINT_CHARS and all(c in "0123456789abcdef" for c in fp),
                f"{field}.fingerprint", fp, f"must be a string of {FINGERPRINT_CHARS} lowercase hex "
                "digits (quote it in YAML if it is all digits)")
        return cls(string(f"{field}.name", data["name"]), fp)


def _marks(data: Any, field: str) -> tuple[SpecMark, ...]:
    """A mark, or a non-empty list of them (a hand-written plan made for several specs)."""
    if isinstance(data, list):
        require(len(data) >= 1, field, data, "must name at least one spec")
        return tuple(SpecMark.from_dict(d, f"{field}[{i}]") for i, d in enumerate(data))
    return (SpecMark.from_dict(data, field),)


@dataclass(frozen=True)
class MadeFor:
    """The workloads and clusters a plan is for (hetrl writes one of each; a hand-written plan
    may list several). An empty tuple: not recorded, not checked."""

    workload: tuple[SpecMark, ...] = ()
    cluster: tuple[SpecMark, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, marks in (("workload", self.workload), ("cluster", self.cluster)):
            if marks:
                out[key] = marks[0].to_dict() if len(marks) == 1 else [m.to_dict() for m in marks]
        return out

    @classmethod
    def from_dict(cls, data: Any, field: str = "made_for") -> MadeFor:
        require(isinstance(data, Mapping), field, data, "must be a mapping")
        for key in data:
            require(key in ("workload", "cluster"), f"{field}.{key}", data[key],
                    "unknown key; known keys: ['cluster', 'workload']")
        return cls(*(_marks(data[k], f"{field}.{k}") if k in data else ()
                     for k in ("workload", "cluster")))


def made_for(workload: WorkloadSpec, cluster: ClusterSpec, workload_name: str | None = None,
             cluster_name: str | None = None) -> MadeFor:
    """What a plan for ``workload`` on ``cluster`` records; the names default to the specs'."""
    return MadeFor((SpecMark(workload_name or workload.name, workload_fingerprint(workload)),),
                   (SpecMark(cluster_name or cluster.name, cluster_fingerprint(cluster)),))


def check_plan_for(recorded: MadeFor | None, workload: WorkloadSpec, cluster: ClusterSpec,
                   workload_name: str | None = None, cluster_name: str | None = None,
                   allow_mismatch: bool = False) -> str | None:
    """Raise :class:`PlanMismatchError` if the plan's ``recorded`` fingerprints (its
    ``made_for``) do not match ``workload`` or ``cluster`` (named ``workload_name`` and
    ``cluster_name``, default the specs' names), unless ``allow_mismatch``. Returns a one-line
    warning or None: for a plan that records no fingerprint (an older file), and for an
    allowed mismatch."""
    given = made_for(workload, cluster, workload_name, cluster_name)
    recorded = recorded or MadeFor()
    unrecorded = [k for k in ("workload", "cluster") if not getattr(recorded, k)]
    wrong = []
    for kind in ("cluster", "workload"):
        marks, mark = getattr(recorded, kind), getattr(given, kind)[0]
        if marks and mark.fingerprint not in {m.fingerprint for m in marks}:
            wrong.append((kind, marks, mark))
    if wrong:
        parts = []
        for i, (kind, marks, mark) in enumerate(wrong):
            prints = ", ".join(m.fingerprint for m in marks)
            recorded_as = (f"this {kind} (fingerprint {prints})" if i == 0 and len(marks) == 1
                           else f"these {kind}s (fingerprints {prints})" if i == 0
                           else f"{kind} {' or '.join(map(str, marks))}")
            parts.append(f"the plan was made for {recorded_as}, but the {kind} given is {mark}")
        kind, marks, _ = wrong[0]
        value = marks[0].name if len(marks) == 1 else [m.name for m in marks]
        error = PlanMismatchError(f"made_for.{kind}", value, "; and ".join(parts)
                                  + ("" if allow_mismatch
                                     else "; pass --allow-mismatch to use it anyway"))
        if not allow_mismatch:
            raise error
        return f"{error} (used anyway: --allow-mismatch)"
    if unrecorded:
        return (f"the plan records no {' or '.join(unrecorded)} fingerprint (made_for; a plan "
                "written before hetrl recorded them): not checked against the "
                f"{' and '.join(unrecorded)} given")
    return None

