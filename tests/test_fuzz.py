"""Fuzzing every file loader and the commands that read those files (issue 28): mutations of
valid workload, cluster, plan, params, faults and trace documents -- wrong types, nulls, huge,
negative, NaN and infinite numbers, booleans for integers, lists for strings, deep nesting,
unknown and missing keys -- are either accepted or refused with the project's error in one line
(exit 2; 3 for estimate's "infeasible"), never another exception, within a deadline.

Under the "ci" profile each test runs a few examples; `pytest -m fuzz --hypothesis-profile long`
runs 10,000 per loader (docs/reliability.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetrl.calibrate import load_runs
from hetrl.cost.params import CostParams
from hetrl.errors import HetrlError
from hetrl.io import load_cluster, load_plan, load_workload, read_mapping
from hetrl.spec.presets import cluster_preset, workload_preset
from sim.faults import FaultScenario
from tests import hostile
from tests.cli_helpers import run

pytestmark = pytest.mark.fuzz

#: Examples per test under the active profile: the profile's own count under "long", else a
#: few (the suite's default profile runs the other property tests at 100).
LONG = settings().max_examples >= 10_000


def fuzz(ci_examples: int, deadline_s: float):
    """Settings of one fuzz test: ``ci_examples`` examples (the profile's under "long") and a
    per-example deadline, the time bound of one hostile input."""
    return settings(max_examples=settings().max_examples if LONG else ci_examples,
                    deadline=timedelta(seconds=deadline_s),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def _nest(levels: int) -> Any:
    out: Any = []
    for _ in range(levels):
        out = [out]
    return out


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 2, 3, 64, 65, 4097, 2**31, 10**9, 10**30, -10**30]),
    st.integers(-10**6, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, 0.5, 2.5, math.nan, math.inf, -math.inf]),
    st.text(max_size=12),
    st.sampled_from(["", "abc", "A100", "bf16", "grpo", "null", "true", "1e3", "n0", "us-east-1"]),
    st.lists(st.one_of(st.integers(-2, 5), st.text(max_size=3)), max_size=4),
    st.dictionaries(st.text(max_size=5), st.integers(-2, 5), max_size=3),
    st.integers(60, 80).map(_nest),
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) to an item inside ``doc``, containers included."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        out.append(prefix + (key,))
        out += _paths(value, prefix + (key,))
    return out


@st.composite
def mutations(draw, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A fresh valid document ``make()`` with 1-3 mutations: an item replaced by a hostile
    value, deleted, wrapped in a list, turned into a string, or an unknown key added beside it."""
    doc = make()
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:  # (everything was deleted)
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "wrap", "str",
                                   "unknown"]))
        key = path[-1]
        if op == "replace":
            parent[key] = draw(HOSTILE)
        elif op == "delete":
            del parent[key]
        elif op == "wrap":
            parent[key] = [parent[key]]
        elif op == "str":
            parent[key] = str(parent[key])
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["x", "nodes", "name", "1", "repeat"]))] = draw(HOSTILE)
    return doc


def _write(tmp: Path, name: str, doc: Any) -> Path:
    path = tmp / name
    try:
        return hostile.write(path, doc)
    except (ValueError, OverflowError):  # a document the writer cannot express in that format
        return hostile.write(path, "{}")


def _loads_or_refuses(load) -> Any:
    """``load()``'s result, or None when it raises the project's error (in one line)."""
    try:
        return load()
    except HetrlError as exc:
        assert "\n" not in str(exc), str(exc)
        return None


def _cli(capsys, *argv) -> tuple[int, str]:
    """Run ``hetrl *argv``: exit 0 or 2 (3 for estimate), and a refusal is one line."""
    code, out, err = run(capsys, *argv)
    allowed = (0, 2, 3) if argv[0] == "estimate" else (0, 2)
    assert code in allowed, err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"hetrl {argv[0]}: error: " in lines[0], err
    return code, out


def _tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


W, C, P = hostile.WORKLOAD, hostile.CLUSTER, str(hostile.PLAN_FILE)


# --- loaders -----------------------------------------------------------------------------------

@fuzz(ci_examples=40, deadline_s=10)
@given(doc=mutations(hostile.workload_doc))
def test_workload_loader(tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "w.yaml", doc)
    workload = _loads_or_refuses(lambda: load_workload(path))
    if workload is not None:
        assert workload.samples >= 1


@fuzz(ci_examples=40, deadline_s=10)
@given(doc=mutations(hostile.moe_workload_doc))
def test_moe_workload_loader(tmp_path_factory, doc):
    """The mixture-of-experts and FP8 fields (issue 57) mutated like the rest."""
    path = _write(_tmp(tmp_path_factory), "w.yaml", doc)
    workload = _loads_or_refuses(lambda: load_workload(path))
    if workload is not None:
        assert all(m.active_params <= m.params for _, m in workload.models)


@fuzz(ci_examples=6, deadline_s=60)
@given(doc=mutations(hostile.moe_plan_doc))
def test_expert_parallel_plan_commands(capsys, tmp_path_factory, doc):
    """A plan with expert parallelism, mutated, against the tiny MoE workload."""
    tmp = _tmp(tmp_path_factory)
    workload = _write(tmp, "w.yaml", hostile.moe_workload_doc() | {"gen_precision": None})
    path = _write(tmp, "p.yaml", doc)
    _cli(capsys, "validate", "-w", workload, "-c", C, "-p", path)
    _finite_estimate(*_cli(capsys, "estimate", "-w", workload, "-c", C, "-p", path, "--json"))


@fuzz(ci_examples=40, deadline_s=10)
@given(doc=mutations(hostile.own_gpu_cluster_doc))
def test_cluster_loader(tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "c.yaml", doc)
    cluster = _loads_or_refuses(lambda: load_cluster(path))
    if cluster is not None:
        assert 1 <= cluster.num_devices <= 4096


@fuzz(ci_examples=40, deadline_s=10)
@given(doc=mutations(hostile.plan_doc))
def test_plan_loader(tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "p.json", doc)
    workload, cluster = workload_preset(W), cluster_preset(C)
    plan = _loads_or_refuses(lambda: load_plan(path, workload, cluster))
    if plan is not None:
        assert all(math.isclose(sum(p.data_shares), 1.0) for p in plan.placements)


@fuzz(ci_examples=40, deadline_s=10)
@given(doc=mutations(lambda: CostParams().to_dict()))
def test_params_loader(tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "params.yaml", doc)
    _loads_or_refuses(lambda: CostParams.from_dict(read_mapping(path, "params")))


@fuzz(ci_examples=40, deadline_s=10)
@given(doc=mutations(hostile.faults_doc))
def test_faults_loader(tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "f.yaml", doc)
    cluster = cluster_preset(C)
    nodes: dict[str, list[int]] = {}
    for d in cluster.devices:
        nodes.setdefault(d.node, []).append(d.id)
    scenario = _loads_or_refuses(lambda: FaultScenario.from_dict(
        read_mapping(path, "faults"), cluster.num_devices, cluster.regions, nodes))
    if scenario is not None:
        assert all(math.isfinite(e.at_s) and e.at_s >= 0 for e in scenario.events)


@fuzz(ci_examples=25, deadline_s=20)
@given(doc=mutations(hostile.trace_doc))
def test_trace_loader(tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "t.json", doc)
    runs = _loads_or_refuses(lambda: load_runs([path]))
    if runs is not None:
        assert all(r.measured_iteration_s() > 0 for r in runs)


@fuzz(ci_examples=40, deadline_s=10)
@given(text=st.one_of(st.text(max_size=300), st.binary(max_size=300).map(bytes)),
       suffix=st.sampled_from([".yaml", ".json"]))
def test_any_text_is_read_or_refused_in_one_line(tmp_path_factory, text, suffix):
    path = _write(_tmp(tmp_path_factory), f"x{suffix}", text)
    _loads_or_refuses(lambda: load_workload(path))


# --- commands ----------------------------------------------------------------------------------

def _finite_estimate(code: int, out: str) -> None:
    if code == 0:
        value = json.loads(out)["iteration_s"]
        assert hostile.finite_positive(value), out


@fuzz(ci_examples=6, deadline_s=60)
@given(doc=mutations(hostile.workload_doc))
def test_workload_commands(capsys, tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "w.yaml", doc)
    _cli(capsys, "describe", path)
    _finite_estimate(*_cli(capsys, "estimate", "-w", path, "-c", C, "--colocate", "--json"))


@fuzz(ci_examples=6, deadline_s=60)
@given(doc=mutations(hostile.cluster_doc))
def test_cluster_commands(capsys, tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "c.yaml", doc)
    _cli(capsys, "describe", path)
    _cli(capsys, "bound", "-w", W, "-c", path)


@fuzz(ci_examples=6, deadline_s=60)
@given(doc=mutations(hostile.plan_doc))
def test_plan_commands(capsys, tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "p.yaml", doc)
    _cli(capsys, "validate", "-w", W, "-c", C, "-p", path)
    _finite_estimate(*_cli(capsys, "estimate", "-w", W, "-c", C, "-p", path, "--json"))


@fuzz(ci_examples=6, deadline_s=60)
@given(doc=mutations(hostile.faults_doc))
def test_faults_command(capsys, tmp_path_factory, doc):
    path = _write(_tmp(tmp_path_factory), "f.yaml", doc)
    _cli(capsys, "simulate", "-w", W, "-c", C, "-p", P, "-n", "1", "--faults", path)


@fuzz(ci_examples=4, deadline_s=60)
@given(doc=mutations(hostile.trace_doc))
def test_calibrate_command(capsys, tmp_path_factory, doc):
    tmp = _tmp(tmp_path_factory)
    path = _write(tmp, "t.json", doc)
    _cli(capsys, "calibrate", "--traces", path, "--out", tmp / "params.yaml")
