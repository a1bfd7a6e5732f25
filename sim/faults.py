"""Fault and variation scenarios: events at given times, read from YAML.

```yaml
events:
  - {at_s: 120, kind: device_lost, device: 12}
  - {at_s: 200, kind: node_lost, node: n3-L40S}      # every device of the node
  - {at_s: 30, kind: link_degraded, regions: [us-east-1, us-east-2], bandwidth_factor: 0.2,
     extra_latency_ms: 20}
  - {at_s: 0, kind: straggler, device: 3, slowdown: 1.5}
replan: {scheduler: hetrl, budget_evals: 300, seed: 0, delay_s: 30}   # optional
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetrl.errors import finite_number, integer, is_int, one_of, positive, positive_int, require
from hetrl.limits import MAX_BUDGET_EVALS, MAX_FAULT_EVENTS
from sim.guards import HORIZON_S

KINDS = ("device_lost", "node_lost", "link_degraded", "straggler")
#: The largest straggler factor: a device a million times slower is as good as lost (and the
#: product with a step's seconds must stay far inside the simulator's horizon).
MAX_SLOWDOWN = 1e6


@dataclass(frozen=True)
class FaultEvent:
    at_s: float
    kind: str
    device: int | None = None
    regions: tuple[str, str] | None = None
    bandwidth_factor: float = 1.0
    extra_latency_ms: float = 0.0
    slowdown: float = 1.0


@dataclass(frozen=True)
class Replan:
    """After a device is lost: a new plan for the remaining devices from ``scheduler``, after
    ``delay_s`` seconds of re-planning and restart."""

    scheduler: str = "hetrl"
    budget_evals: int = 300
    seed: int = 0
    delay_s: float = 30.0


@dataclass(frozen=True)
class FaultScenario:
    events: tuple[FaultEvent, ...] = ()
    replan: Replan | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], num_devices: int, regions: tuple[str, ...],
                  nodes: Mapping[str, list[int]] | None = None) -> FaultScenario:
        """Parse a scenario; ``nodes`` (node name -> device ids) resolves ``node_lost`` events
        into one ``device_lost`` event per device of the node, at the same time."""
        require(isinstance(data, Mapping), "faults", data, "must be a mapping with 'events'")
        for key in data:
            require(key in ("events", "replan"), f"faults.{key}", data[key],
                    "unknown key; known keys: events, replan")
        raw = data.get("events")
        raw = [] if raw is None else raw
        require(isinstance(raw, list), "faults.events", raw, "must be a list")
        events = []
        for i, e in enumerate(raw):
            f = f"faults.events[{i}]"
            require(isinstance(e, Mapping), f, e, "must be a mapping")
            one_of(f"{f}.kind", e.get("kind"), KINDS)
            at = finite_number(f"{f}.at_s", e.get("at_s"), lo=0, hi=HORIZON_S, unit="seconds")
            kind = e["kind"]
            allowed = {"at_s", "kind"} | {
                "device_lost": {"device"}, "node_lost": {"node"}, "straggler": {"device", "slowdown"},
                "link_degraded": {"regions", "bandwidth_factor", "extra_latency_ms"}}[kind]
            for key in e:
                require(key in allowed, f"{f}.{key}", e[key], f"not a field of {kind}: {sorted(allowed)}")
            if kind == "node_lost":
                known = nodes or {}
                require(isinstance(e.get("node"), str) and e["node"] in known, f"{f}.node",
                        e.get("node"), f"not a node of the cluster: {sorted(known)}")
                events += [FaultEvent(float(at), "device_lost", d) for d in known[e["node"]]]
                require(len(events) <= MAX_FAULT_EVENTS, f, e,
                        f"a scenario holds at most {MAX_FAULT_EVENTS:,} events")
                continue
            if kind in ("device_lost", "straggler"):
                d = e.get("device")
                require(is_int(d) and 0 <= d < num_devices,
                        f"{f}.device", d, f"must be a device id in 0..{num_devices - 1}")
            if kind == "straggler":
                s = positive(f"{f}.slowdown", e.get("slowdown", 1.0))
                require(1.0 <= s <= MAX_SLOWDOWN, f"{f}.slowdown", s,
                        f"must be in [1, {MAX_SLOWDOWN:.0e}] (a factor on step times)")
            pair = None
            if kind == "link_degraded":
                pair = e.get("regions")
                require(isinstance(pair, list | tuple) and len(pair) == 2
                        and all(isinstance(r, str) for r in pair) and pair[0] != pair[1],
                        f"{f}.regions", pair, "must be two different region names")
                for r in pair:
                    require(r in regions, f"{f}.regions", r, f"not a region of the cluster: {list(regions)}")
                bf = positive(f"{f}.bandwidth_factor", e.get("bandwidth_factor", 1.0))
                require(bf <= 1.0, f"{f}.bandwidth_factor", bf, "must be in (0, 1]")
                finite_number(f"{f}.extra_latency_ms", e.get("extra_latency_ms", 0.0), 0, 1000,
                              "milliseconds")
            require(len(events) < MAX_FAULT_EVENTS, f, e,
                    f"a scenario holds at most {MAX_FAULT_EVENTS:,} events")
            events.append(FaultEvent(
                float(at), kind, e.get("device"), tuple(pair) if pair else None,
                float(e.get("bandwidth_factor", 1.0)), float(e.get("extra_latency_ms", 0.0)),
                float(e.get("slowdown", 1.0))))
        replan = None
        if data.get("replan") is not None:
            r = data["replan"]
            require(isinstance(r, Mapping), "faults.replan", r, "must be a mapping")
            for key in r:
                require(key in Replan.__dataclass_fields__, f"faults.replan.{key}", r[key],
                        f"unknown key; known: {sorted(Replan.__dataclass_fields__)}")
            replan = Replan(**r)
            positive_int("faults.replan.budget_evals", replan.budget_evals, MAX_BUDGET_EVALS)
            finite_number("faults.replan.delay_s", replan.delay_s, lo=0, hi=HORIZON_S,
                          unit="seconds")
            integer("faults.replan.seed", replan.seed, lo=0)
            from hetrl.search import SCHEDULERS, load_all

            load_all()  # checked now, not when the fault fires
            require(isinstance(replan.scheduler, str) and replan.scheduler in SCHEDULERS,
                    "faults.replan.scheduler", replan.scheduler,
                    f"unknown scheduler; known: {sorted(SCHEDULERS)}")
        return cls(tuple(sorted(events, key=lambda e: e.at_s)), replan)


@dataclass
class FaultLog:
    """What the faults did: lost devices, stalls, lost and re-done work."""

    lost_devices: list[int] = field(default_factory=list)
    stalled: bool = False
    stalled_at_s: float | None = None
    lost_work_s: float = 0.0
    aborted_iterations: list[int] = field(default_factory=list)
    replans: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"lost_devices": self.lost_devices, "stalled": self.stalled,
                "stalled_at_s": self.stalled_at_s, "lost_work_s": self.lost_work_s,
                "aborted_iterations": self.aborted_iterations, "replans": self.replans}


