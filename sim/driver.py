"""simulate(plan, workload, cluster, iterations, seed) -> SimResult(trace, metrics, faults).

Runs the plan in segments: a device loss ends a segment; with a re-plan hook (or the scenario's
``replan``) the remaining devices get a new plan and the run continues after the re-plan delay;
without one the run stalls and reports it. Link faults and stragglers take effect mid-segment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetrl.cost.params import DEFAULT_PARAMS, CostParams
from hetrl.errors import HetrlError
from hetrl.plan import Plan, validate
from hetrl.spec.cluster import ClusterSpec, NodeSpec
from hetrl.spec.tasks import REPORTED_TASKS
from hetrl.spec.workload import WorkloadSpec
from hetrl.trace import Span, Trace
from sim.engine import Simulation
from sim.faults import FaultLog, FaultScenario
from sim.network import LinkFault

ReplanHook = Callable[[WorkloadSpec, ClusterSpec], Plan]


@dataclass
class SimResult:
    trace: Trace
    metrics: dict[str, Any]
    faults: FaultLog = field(default_factory=FaultLog)

    @property
    def iteration_s(self) -> float:
        return self.metrics["iteration_s"]

    def to_dict(self) -> dict[str, Any]:
        return {**self.metrics, "faults": self.faults.to_dict()}


def without_devices(cluster: ClusterSpec, devices: set[int]) -> tuple[ClusterSpec, list[int]]:
    """The cluster minus some devices, and for each new device id the old one."""
    nodes, mapping, start = [], [], 0
    for node in cluster.nodes:
        ids = list(range(start, start + node.count))
        start += node.count
        keep = [d for d in ids if d not in devices]
        if keep:
            nodes.append(NodeSpec(node.name, node.gpu, len(keep), node.region, node.zone,
                                  node.nic_gbps, node.edge))
            mapping += keep
    if not nodes:
        raise HetrlError("no device left after the fault")
    name = cluster.name + "-minus-" + "-".join(str(d) for d in sorted(devices))
    return (ClusterSpec(name, tuple(nodes), cluster.region_links, cluster.network,
                        cluster.gpu_types), mapping)


def default_replan_hook(scenario: FaultScenario, params: CostParams) -> ReplanHook | None:
    if scenario.replan is None:
        return None
    r = scenario.replan

    def hook(workload: WorkloadSpec, cluster: ClusterSpec) -> Plan:
        from hetrl.search import Budget, get_scheduler

        return get_scheduler(r.scheduler, params).search(
            workload, cluster, Budget(evaluations=r.budget_evals, seed=r.seed)).plan
    return hook


def simulate(plan: Plan, workload: WorkloadSpec, cluster: ClusterSpec, iterations: int,
             seed: int = 0, params: CostParams = DEFAULT_PARAMS,
             faults: FaultScenario | None = None, replan: ReplanHook | None = None,
             progress: Callable[[float, int], None] | None = None) -> SimResult:
    """Replay ``iterations`` RL iterations of ``plan``; see the module docstring for faults.
    ``progress``, if given, is called now and then with (simulated seconds, iterations done).
    Raises :class:`sim.guards.SimulationLimitError` where simulated time would leave the range
    the simulator resolves (docs/simulator.md, "Guards")."""
    validate(plan, workload, cluster)
    if iterations < 1:
        raise HetrlError(f"iterations = {iterations}: must be >= 1")
    faults = faults or FaultScenario()
    replan = replan or default_replan_hook(faults, params)
    log = FaultLog()
    spans: list[Span] = []
    its: list[tuple[float, float]] = []
    t0 = 0.0
    cur_cluster, cur_plan = cluster, plan
    mapping = list(range(cluster.num_devices))  # current device id -> original id
    pending = [e for e in faults.events]
    events = 0
    sims: list[Simulation] = []
    while len(its) < iterations:
        sim = Simulation(cur_plan, workload, cur_cluster, params, seed, t0, len(its))
        sims.append(sim)
        if progress is not None:
            sim.progress = _offset(progress, len(its))
        inverse = {old: new for new, old in enumerate(mapping)}
        stop = None
        lost_event = None
        for e in pending:
            if e.kind == "device_lost" and e.device in inverse and inverse[e.device] in cur_plan.device_ids:
                lost_event = e
                break
        for e in pending:
            if lost_event is not None and e.at_s > lost_event.at_s:
                continue
            sim.env.process(_apply(sim, e, inverse, max(e.at_s - t0, 0.0), spans))
        if lost_event is not None:
            stop = sim.env.timeout(max(lost_event.at_s - t0, 0.0))
        sim.run(iterations - len(its), stop=stop)
        events += sim.events
        complete = len(its) + len(sim.iterations)  # spans of later iterations were cut short
        for sp in sim.spans:
            meta = sp.meta if sp.iteration < complete else {**sp.meta, "aborted": True}
            spans.append(Span(sp.name, sp.kind, sp.task, sp.iteration, sp.start_s, sp.end_s,
                              tuple(mapping[d] for d in sp.devices), sp.bytes, meta))
        its += sim.iterations
        pending = [e for e in pending if e.at_s > sim.env.now or (
            lost_event is not None and e is not lost_event and e.at_s >= lost_event.at_s)]
        if lost_event is None or len(its) >= iterations:
            break
        # A device used by the plan is lost: the iteration(s) in flight are lost. Every device
        # lost by now (this one, its node's others, unused ones) leaves the cluster.
        t_fail = lost_event.at_s
        gone = [e for e in faults.events if e.kind == "device_lost" and e.at_s <= t_fail
                and e.device in inverse]
        last_end = its[-1][1] if its else t0
        log.lost_devices += [e.device for e in gone]
        log.lost_work_s += t_fail - max(last_end, t0)
        log.aborted_iterations.append(len(its))
        spans.append(Span("device lost", "fault", "", len(its), t_fail, t_fail,
                          tuple(e.device for e in gone), 0.0,
                          {"detail": f"devices {[e.device for e in gone]}"}))
        pending = [e for e in pending if e not in gone]
        if replan is None:
            log.stalled, log.stalled_at_s = True, t_fail
            break
        cur_cluster, keep = without_devices(cur_cluster, {inverse[e.device] for e in gone})
        mapping = [mapping[k] for k in keep]
        cur_plan = replan(workload, cur_cluster)
        delay = faults.replan.delay_s if faults.replan else 0.0
        log.replans.append({"at_s": t_fail, "devices": cur_cluster.num_devices,
                            "scheduler": cur_plan.provenance.scheduler, "delay_s": delay})
        t0 = t_fail + delay
    meta = {"seed": seed, "events": events, "plan_scheduler": plan.provenance.scheduler}
    if not log.replans:  # the specs it ran, as the real runner's traces carry (hetrl calibrate)
        meta.update(workload_spec=workload.to_dict(), cluster_spec=cluster.to_dict(),
                    plan=plan.to_dict())
    trace = Trace("sim", workload.name, cluster.name, tuple(spans), tuple(its), meta)
    return SimResult(trace, _metrics(trace, sims, iterations, log, cluster, workload), log)


def _offset(progress: Callable[[float, int], None], before: int) -> Callable[[float, int], None]:
    """``progress`` for a segment that starts with ``before`` iterations done."""
    return lambda now, done: progress(now, before + done)


def _apply(sim: Simulation, e, inverse: dict[int, int], delay: float, spans: list[Span]):
    yield sim.env.timeout(delay)
    if e.kind == "straggler" and e.device in inverse:
        sim.slowdown[inverse[e.device]] = e.slowdown
    elif e.kind == "link_degraded":
        sim.add_link_fault(LinkFault(e.regions[0], e.regions[1], e.bandwidth_factor,
                                     e.extra_latency_ms / 1e3))
    elif e.kind == "device_lost":
        return
    spans.append(Span(e.kind, "fault", "", -1, sim.env.now, sim.env.now,
                      (e.device,) if e.device is not None else (), 0.0,
                      {"detail": str(e.regions or e.slowdown)}))


def steady_iterations(secs: list[float], period: int) -> list[float]:
    """The iteration times (seconds) that the steady-state mean ``iteration_s`` averages: those
    after the pipeline fill -- the first iteration in sync mode; in async mode (``period`` =
    staleness + 1) the first k + 1, where a whole period remains after them (generation runs up
    to k iterations ahead, so the iterations right after the first are short while the trainer
    catches up). A group sharing GPUs between generation and the other tasks runs in periods of
    k + 1 iterations (the next k generations take the GPUs first), and the last iteration has
    no later generation to compete with: where a whole period is left, the last is dropped and
    the rest cut to whole periods (docs/simulator.md)."""
    fill = period if len(secs) >= 2 * period else 1
    after = secs[fill:] if len(secs) > fill else list(secs)
    if period > 1 and len(after) > period:
        after = after[:-1]
        after = after[: len(after) // period * period]
    return after


def _metrics(trace: Trace, sims: list[Simulation], iterations: int, log: FaultLog,
             cluster: ClusterSpec, workload: WorkloadSpec) -> dict[str, Any]:
    secs = trace.iteration_seconds()
    steady = steady_iterations(secs, 1 + (workload.staleness if workload.mode == "async" else 0))
    tasks = trace.task_seconds()
    per_iteration = []
    for i, (start, end) in enumerate(trace.iterations):
        busy: dict[int, float] = {}
        task_s: dict[str, float] = {}
        for s in trace.spans:
            if s.iteration == i and s.kind == "task":
                task_s[s.task] = task_s.get(s.task, 0.0) + s.duration_s
            if s.kind == "tasklet" and s.iteration == i:
                for d in s.devices:
                    busy[d] = busy.get(d, 0.0) + s.duration_s
        window = max(end - start, 1e-12)
        per_iteration.append({
            "iteration": i, "seconds": end - start,
            "tasks": {t: task_s.get(t, 0.0) for t in REPORTED_TASKS},
            "device_utilization": {str(d): min(b / window, 1.0) for d, b in sorted(busy.items())},
            "bubble_fraction": _bubble(trace, i),
        })
    links: dict[str, float] = {}
    for sim in sims:
        for (a, b), nbytes in sim.net.stats.bytes_between_nodes.items():
            links[f"{a}->{b}"] = links.get(f"{a}->{b}", 0.0) + nbytes
    return {
        "iteration_s": float(np.mean(steady)) if steady else float("nan"),
        "iterations": secs,
        "tasks": {t: tasks.get(t, 0.0) for t in REPORTED_TASKS},
        "completed_iterations": len(secs),
        "requested_iterations": iterations,
        "per_iteration": per_iteration,
        "bytes_between_nodes": links,
        "events": trace.meta.get("events", 0),
        "stalled": log.stalled,
        "phases": phases(trace, log, workload.samples),
    }


def phases(trace: Trace, log: FaultLog, samples: int) -> dict[str, Any]:
    """The run split at its first fault (empty without one): ``fault_at_s``; ``before_fault``
    (iterations that ended by then), ``during_fault`` (iterations under way when it struck,
    that finished), ``after_fault`` (iterations that started after it -- after the re-plan's
    restart when a device was lost), each {iterations, from_s, to_s, iteration_s (mean
    seconds, None without iterations), throughput_samples_per_s}; ``replan`` (seconds from the
    loss to the restart, None without one) and ``stalled_at_s``. Seconds are simulated time."""
    struck = [s.start_s for s in trace.spans if s.kind == "fault"]
    if not struck:
        return {}
    t_fault = min(struck)
    restart = (log.replans[0]["at_s"] + log.replans[0]["delay_s"]) if log.replans else None
    after_from = restart if restart is not None else t_fault
    groups: dict[str, list[tuple[float, float]]] = {"before_fault": [], "during_fault": [],
                                                    "after_fault": []}
    for start, end in trace.iterations:
        key = ("before_fault" if end <= t_fault else "after_fault" if start >= after_from
               else "during_fault")
        groups[key].append((start, end))
    out: dict[str, Any] = {"fault_at_s": t_fault}
    for key, its in groups.items():
        secs = [b - a for a, b in its]
        mean = sum(secs) / len(secs) if secs else None
        out[key] = {"iterations": len(its), "from_s": its[0][0] if its else None,
                    "to_s": its[-1][1] if its else None, "iteration_s": mean,
                    "throughput_samples_per_s": samples / mean if mean else None}
    out["replan_s"] = restart - log.replans[0]["at_s"] if restart is not None else None
    out["stalled_at_s"] = log.stalled_at_s
    return out


def _bubble(trace: Trace, iteration: int) -> dict[str, float]:
    """Per training task: 1 - (stage busy time) / (devices x task time) -- idle pipeline slots."""
    out = {}
    for s in trace.spans:
        if s.kind == "task" and s.iteration == iteration and "training" in s.task:
            busy = sum(x.duration_s * len(x.devices) for x in trace.spans
                       if x.kind == "tasklet" and x.task == s.task and x.iteration == iteration)
            cap = s.duration_s * len(s.devices)
            out[s.task] = max(0.0, 1 - busy / cap) if cap > 0 else 0.0
    return out
