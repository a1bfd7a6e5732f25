"""The Trace schema: exact round trip, Chrome export structure, per-task means."""

from __future__ import annotations

import json

import pytest

from hetrl.errors import SpecError
from hetrl.plan import colocated_plan
from hetrl.trace import SCHEMA_VERSION, Span, Trace, task_spans
from sim import simulate
from tests.sim.tiny import one_node, tiny_workload


def small_trace() -> Trace:
    spans = (
        Span("actor_generation", "task", "actor_generation", 0, 0.0, 2.0, (0, 1)),
        Span("actor_generation[0]", "tasklet", "actor_generation", 0, 0.0, 2.0, (0, 1),
             meta={"sequences": 4}),
        Span("weights", "transfer", "weight_sync", 0, 3.0, 3.5, (2, 0), 1e6, {"flows": 1}),
        Span("actor_generation", "task", "actor_generation", 1, 4.0, 7.0, (0, 1)),
        Span("actor_generation", "task", "actor_generation", 2, 8.0, 9.0, (0, 1)),
        # iteration 3 was cut short by a fault: left out of the means
        Span("actor_generation", "task", "actor_generation", 3, 10.0, 30.0, (0, 1),
             meta={"aborted": True}),
        Span("device lost", "fault", "", 3, 20.0, 20.0, (1,), meta={"detail": "device 1"}),
        Span("run", "collective", "actor_training", 0, 1.0, 1.5, (), 10.0,
             meta={"nested": {"not": "exported"}}),
    )
    return Trace("sim", "w", "c", spans, ((0.0, 4.0), (4.0, 8.0), (8.0, 10.0)), {"seed": 3})


def test_round_trip_is_exact_also_through_json():
    t = small_trace()
    assert Trace.from_dict(t.to_dict()) == t
    assert Trace.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    # a simulated trace too
    wl, cluster = tiny_workload(), one_node(1)
    sim_trace = simulate(colocated_plan(wl, cluster), wl, cluster, 2).trace
    assert Trace.from_dict(json.loads(json.dumps(sim_trace.to_dict()))) == sim_trace


def test_views():
    t = small_trace()
    assert t.iteration_seconds() == [4.0, 4.0, 2.0]
    # after the first iteration: (3 + 1) / 2; the aborted 20 s span of iteration 3 is skipped
    assert t.task_seconds() == {"actor_generation": 2.0}
    assert t.task_seconds(skip_first=False) == {"actor_generation": 2.0}  # (2 + 3 + 1) / 3
    assert [s.name for s in t.spans_of("transfer")] == ["weights"]
    assert len(t.spans_of(task="actor_generation")) == 5
    assert t.spans[2].duration_s == 0.5


def test_to_chrome_structure():
    t = small_trace()
    chrome = t.to_chrome()
    json.dumps(chrome)  # serialisable
    events = chrome["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    # one complete event per span and device (a span without devices goes to pid -1)
    assert len(complete) == sum(max(len(s.devices), 1) for s in t.spans) == 14
    for e in complete:
        assert set(e) == {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}
        assert e["dur"] >= 0 and e["tid"] == e["cat"]
    w = [e for e in complete if e["name"] == "weights"]
    assert [e["pid"] for e in w] == [2, 0]
    assert w[0]["ts"] == 3.0e6 and w[0]["dur"] == 0.5e6  # microseconds
    assert w[0]["args"] == {"task": "weight_sync", "iteration": 0, "bytes": 1e6, "flows": 1}
    run = [e for e in complete if e["name"] == "run"][0]
    assert run["pid"] == -1 and "nested" not in run["args"]
    assert {e["pid"] for e in meta} == {-1, 0, 1, 2}
    assert {e["args"]["name"] for e in meta} == {"run", "device 0", "device 1", "device 2"}
    assert chrome["otherData"] == {"source": "sim", "workload": "w", "cluster": "c"}


def test_bad_traces_name_the_field():
    d = small_trace().to_dict()
    with pytest.raises(SpecError, match=r"trace\.schema_version"):
        Trace.from_dict({**d, "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(SpecError, match=r"trace\.spans\[1\]\.kind"):
        Trace.from_dict({**d, "spans": [d["spans"][0], {**d["spans"][1], "kind": "nap"}]})
    with pytest.raises(SpecError, match=r"trace\.spans\[0\]\.end_s"):
        Trace.from_dict({**d, "spans": [{k: v for k, v in d["spans"][0].items() if k != "end_s"}]})
    with pytest.raises(SpecError, match=r"trace\.iterations"):
        Trace.from_dict({**d, "iterations": [[1.0]]})
    with pytest.raises(SpecError, match=r"trace\.source"):
        Trace.from_dict({k: v for k, v in d.items() if k != "source"})


def test_a_task_span_occupies_its_own_devices_not_its_inputs_sources():
    """A real run's reward inference on device 2 receives its input from the generation devices
    0 and 1: its task span covers the transfer's time but only device 2 (a Gantt chart per GPU
    must not show reward inference on the generation GPUs). A weight sync, all transfers,
    occupies the devices its weights moved between."""
    spans = [
        Span("actor_generation", "tasklet", "actor_generation", 0, 0.0, 2.0, (0,)),
        Span("actor_generation", "tasklet", "actor_generation", 0, 0.0, 2.5, (1,)),
        Span("reward_inference input", "transfer", "reward_inference", 0, 2.5, 2.75, (0, 1, 2),
             4096.0),
        Span("reward_inference", "tasklet", "reward_inference", 0, 2.5, 3.5, (2,)),
        Span("actor_training grad all-reduce", "collective", "actor_training", 0, 4.5, 5.0,
             (3, 4)),
        Span("actor_training input", "transfer", "actor_training", 0, 3.5, 3.75, (0, 3), 8.0),
        Span("actor_training", "tasklet", "actor_training", 0, 3.5, 5.0, (3,)),
        Span("weight_sync -> actor_generation", "transfer", "weight_sync", 0, 5.0, 6.0, (3, 0)),
        Span("weight_sync -> actor_generation", "transfer", "weight_sync", 0, 5.0, 5.5, (3, 1)),
        Span("reward_inference", "tasklet", "reward_inference", 1, 9.0, 9.5, (2,)),
    ]
    got = {(s.task, s.iteration): (s.start_s, s.end_s, s.devices) for s in task_spans(spans)}
    assert got == {("actor_generation", 0): (0.0, 2.5, (0, 1)),
                   ("reward_inference", 0): (2.5, 3.5, (2,)),
                   ("actor_training", 0): (3.5, 5.0, (3, 4)),
                   ("weight_sync", 0): (5.0, 6.0, (0, 1, 3)),
                   ("reward_inference", 1): (9.0, 9.5, (2,))}
    out = task_spans(spans)
    assert all(s.kind == "task" and s.name == s.task for s in out)
    assert [s.start_s for s in out] == sorted(s.start_s for s in out)
    # the task's time includes its input transfer when that starts first
    early = [Span("x input", "transfer", "x", 0, 1.0, 2.0, (0, 5)),
             Span("x", "tasklet", "x", 0, 2.0, 3.0, (5,))]
    assert [(s.start_s, s.end_s, s.devices) for s in task_spans(early)] == [(1.0, 3.0, (5,))]


def test_version_1_traces_load_and_phase_spans_need_version_2():
    """Version 2 added ``phase`` spans; a version-1 trace (none) still loads, and a phase span
    in one is a clear error."""
    d = small_trace().to_dict()
    assert SCHEMA_VERSION == 2
    old = Trace.from_dict({**d, "schema_version": 1})
    assert old.schema_version == 1 and old.spans == Trace.from_dict(d).spans
    phase = {**d["spans"][0], "kind": "phase", "name": "prefill"}
    with pytest.raises(SpecError, match=r"trace\.spans\[1\]\.kind = 'phase'"):
        Trace.from_dict({**d, "schema_version": 1, "spans": [d["spans"][0], phase]})
    assert Trace.from_dict({**d, "spans": [d["spans"][0], phase]}).spans[1].kind == "phase"


def test_phase_seconds_take_the_slowest_replica_per_iteration():
    spans = [Span("prefill", "phase", "gen", it, 0.0, x, (d,)) for it, d, x in
             ((0, 0, 9.0), (1, 0, 1.0), (1, 1, 3.0), (2, 0, 2.0))]
    spans += [Span("decode", "phase", "gen", it, 0.0, 5.0 + it, (0,)) for it in (0, 1, 2)]
    trace = Trace("sim", "w", "c", tuple(spans), ((0, 10), (10, 20), (20, 30)))
    assert trace.phase_seconds("gen") == {"prefill": 2.5, "decode": 6.5}  # after iteration 0
    assert trace.phase_seconds("gen", skip_first=False)["prefill"] == pytest.approx(14 / 3)
    assert trace.phase_seconds("other") == {}
