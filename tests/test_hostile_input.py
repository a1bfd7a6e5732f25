"""Hostile input (issue 28): every case an audit found, as a regression test. Each bad file is
refused with exit 2, one line, naming the field (or the file), before any large work."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hetrl.errors import SpecError
from hetrl.io import read_data
from hetrl.limits import MAX_GPUS, MAX_NESTING, MAX_YAML_BYTES
from tests import hostile
from tests.cli_helpers import assert_user_error, run

W, C, P = hostile.WORKLOAD, hostile.CLUSTER, str(hostile.PLAN_FILE)
HF_CONFIG = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}


def _workload(**changes):
    return {**hostile.workload_doc(), **changes}


def _cluster_nodes(*nodes, **changes):
    return {**hostile.cluster_doc(), "nodes": list(nodes), "region_links": [], **changes}


def _plan_placement(task: str, **changes):
    doc = hostile.plan_doc()
    for p in doc["placements"]:
        if p["task"] == task:
            p.update(changes)
    return doc


def _faults(event=None, **replan):
    doc = hostile.faults_doc()
    if event is not None:
        doc["events"] = [event]
    doc["replan"].update(replan)
    return doc


def _trace(**changes):
    return {**hostile.trace_doc(), **changes}


def _trace_span(**changes):
    doc = hostile.trace_doc()
    doc["spans"][0].update(changes)
    return doc


# (id, file name, document, argv with {f} for the file, fragments of the one error line)
CASES = [
    # denial of service by a small file
    ("alias-bomb-name", "w.yaml", hostile.alias_bomb("name"), ["describe", "{f}"],
     ["aliases", "w.yaml"]),
    ("alias-bomb-region", "c.yaml", hostile.alias_bomb("region"), ["describe", "{f}"],
     ["aliases"]),
    ("alias-bomb-gpu", "c.yaml", hostile.alias_bomb("gpu"), ["bound", "-w", W, "-c", "{f}"],
     ["aliases"]),
    ("alias-bomb-plan", "p.yaml", hostile.alias_bomb("groups"),
     ["validate", "-w", W, "-c", C, "-p", "{f}"], ["aliases"]),
    # (libyaml stops at 1000 levels with its own message; hetrl at 64)
    ("nesting-20000-yaml", "w.yaml", hostile.deep(20_000), ["describe", "{f}"],
     ["malformed yaml", "nest"]),
    ("nesting-100-yaml", "w.yaml", hostile.deep(100), ["describe", "{f}"],
     [f"nested deeper than {MAX_NESTING}"]),
    ("nesting-20000-json", "p.json", hostile.deep(20_000),
     ["validate", "-w", W, "-c", C, "-p", "{f}"], [f"nested deeper than {MAX_NESTING}"]),
    ("nesting-100-json", "t.json", hostile.deep(100), ["calibrate", "--traces", "{f}", "--out",
                                                      "{tmp}/p.yaml"], ["nested deeper"]),
    ("repeat-100000", "c.yaml", _cluster_nodes({"gpu": "A100", "count": 64, "repeat": 100_000}),
     ["describe", "{f}"], ["nodes[0].repeat = 100000", "<= 512"]),
    ("repeat-200", "c.yaml", _cluster_nodes({"gpu": "A100", "count": 64, "repeat": 200}),
     ["describe", "{f}"], ["nodes[0].repeat = 200", f"at most {MAX_GPUS} GPUs"]),
    ("gpus-over-cap-spread", "c.yaml",
     _cluster_nodes(*[{"gpu": "A100", "count": 64, "repeat": 32} for _ in range(3)]),
     ["describe", "{f}"], ["nodes[2].repeat", f"at most {MAX_GPUS} GPUs"]),
    ("batch-prompts-1e9", "w.yaml", _workload(batch_prompts=10**9),
     ["estimate", "-w", "{f}", "-c", C, "--colocate"], ["batch_prompts = 1000000000", "<="]),
    ("batch-prompts-1e30", "w.yaml", _workload(batch_prompts=10**30),
     ["simulate", "-w", "{f}", "-c", C, "-p", P, "-n", "1"], ["batch_prompts", "<="]),
    ("samples-over-cap", "w.yaml", _workload(batch_prompts=65_536, responses_per_prompt=8),
     ["describe", "{f}"], ["batch_prompts = 65536", "sequences per iteration"]),
    # wrong types reach Python
    ("precision-list", "w.yaml", _workload(precision=["bf16"]), ["describe", "{f}"],
     ["precision = ['bf16']", "string"]),
    ("integer-top-level-key", "w.yaml", "1: 2\nalgorithm: grpo\n", ["describe", "{f}"],
     ["keys must be strings", "line 1"]),
    ("hf-config-heads-0", "w.yaml", None, ["describe", "{f}"],
     ["num_attention_heads = 0", ">= 1"]),
    ("hf-config-heads-string", "w.yaml", None, ["describe", "{f}"],
     ["num_attention_heads = 'x'", "integer"]),
    ("algorithm-null", "w.yaml", _workload(algorithm=None), ["describe", "{f}"],
     ["algorithm = None"]),
    ("binary-content", "c.yaml", bytes(range(256)) * 4, ["describe", "{f}"], ["not UTF-8"]),
    ("nul-byte", "c.yaml", "nodes: []\n\x00\n", ["describe", "{f}"], ["malformed yaml"]),
    ("big-integer-literal", "w.json", '{"batch_prompts": ' + "9" * 5000 + "}",
     ["describe", "{f}"], ["malformed json", "4300 digits"]),
    ("faults-node-list", "f.yaml", _faults({"at_s": 1, "kind": "node_lost", "node": ["n0"]}),
     ["simulate", "-w", W, "-c", C, "-p", P, "-n", "1", "--faults", "{f}"],
     ["faults.events[0].node = ['n0']"]),
    ("faults-replan-scheduler-list", "f.yaml", _faults(scheduler=["hetrl"]),
     ["simulate", "-w", W, "-c", C, "-p", P, "-n", "1", "--faults", "{f}"],
     ["faults.replan.scheduler = ['hetrl']"]),
    ("faults-budget-evals-lots", "f.yaml", _faults(budget_evals="lots"),
     ["simulate", "-w", W, "-c", C, "-p", P, "-n", "1", "--faults", "{f}"],
     ["faults.replan.budget_evals = 'lots'", "integer"]),
    ("trace-iteration-abc", "t.json", _trace_span(iteration="abc"),
     ["calibrate", "--traces", "{f}", "--out", "{tmp}/p.yaml"],
     ["trace.spans[0].iteration = 'abc'", "integer"]),
    ("trace-spans-5", "t.json", _trace(spans=5),
     ["calibrate", "--traces", "{f}", "--out", "{tmp}/p.yaml"], ["trace.spans = 5", "list"]),
    ("trace-meta-abc", "t.json", _trace(meta="abc"),
     ["calibrate", "--traces", "{f}", "--out", "{tmp}/p.yaml"], ["trace.meta = 'abc'", "mapping"]),
    # silently wrong
    ("data-weights-overflow", "p.yaml",
     _plan_placement("actor_generation", data_weights=[1e308, 1e308]),
     ["estimate", "-w", W, "-c", C, "-p", "{f}"], ["data_weights", "finite sum"]),
    ("region-links-twice-reversed", "c.yaml",
     _cluster_nodes({"gpu": "A100", "count": 2, "region": "r1"},
                    {"gpu": "L4", "count": 2, "region": "r2"},
                    region_links=[{"a": "r1", "b": "r2", "latency_ms": 10, "bandwidth_gbps": 5},
                                  {"a": "r2", "b": "r1", "latency_ms": 90, "bandwidth_gbps": 1}]),
     ["describe", "{f}"], ["region_links[1] = ['r2', 'r1']", "region_links[0]"]),
    ("region-null", "c.yaml", _cluster_nodes({"gpu": "A100", "count": 2, "region": None}),
     ["describe", "{f}"], ["nodes[0].region = None", "string"]),
    ("layers-per-stage-bool", "p.yaml", _plan_placement("actor_training", layers_per_stage=[True, 3]),
     ["validate", "-w", W, "-c", C, "-p", "{f}"], ["layers_per_stage[0] = True"]),
    ("trace-nan-iteration", "t.json", _trace(iterations=[[0.0, math.nan], [1.0, 2.0]]),
     ["calibrate", "--traces", "{f}", "--out", "{tmp}/p.yaml"],
     ["trace.iterations[0][1] = nan", "finite"]),
    ("trace-negative-iteration", "t.json", _trace(iterations=[[1.0, 0.5], [1.0, 2.0]]),
     ["calibrate", "--traces", "{f}", "--out", "{tmp}/p.yaml"],
     ["trace.iterations[0][1] = 0.5", ">= 1"]),
    ("faults-at-inf", "f.yaml", _faults({"at_s": math.inf, "kind": "device_lost", "device": 1}),
     ["simulate", "-w", W, "-c", C, "-p", P, "-n", "1", "--faults", "{f}"],
     ["faults.events[0].at_s = inf", "finite"]),
    ("faults-budget-evals-2.5", "f.yaml", _faults(budget_evals=2.5),
     ["simulate", "-w", W, "-c", C, "-p", P, "-n", "1", "--faults", "{f}"],
     ["faults.replan.budget_evals = 2.5", "integer"]),
    ("faults-budget-evals-huge", "f.yaml", _faults(budget_evals=10**12),
     ["simulate", "-w", W, "-c", C, "-p", P, "-n", "1", "--faults", "{f}"],
     ["faults.replan.budget_evals", "<= 10,000,000"]),
    ("yaml-over-size-cap", "w.yaml", "#" * (MAX_YAML_BYTES + 1), ["describe", "{f}"],
     ["larger than"]),
    ("staleness-bool", "w.yaml", _workload(mode="async", staleness=True), ["describe", "{f}"],
     ["staleness = True", "integer"]),
    ("network-number-as-string", "c.yaml", {**hostile.cluster_doc(),
                                            "network": {"edge_latency_ms": "5"}},
     ["describe", "{f}"], ["network.edge_latency_ms = '5'", "number"]),
]


def _hf_workload(tmp_path: Path, heads) -> dict:
    (tmp_path / "config.json").write_text(json.dumps({**HF_CONFIG, "num_attention_heads": heads}))
    return _workload(models={"actor": {"hf_config": "config.json"}})


@pytest.mark.parametrize("name, filename, doc, argv, fragments", CASES,
                         ids=[c[0] for c in CASES])
def test_hostile_file_is_one_line_exit_2(capsys, tmp_path, name, filename, doc, argv, fragments):
    if name.startswith("hf-config-heads"):
        doc = _hf_workload(tmp_path, 0 if name.endswith("0") else "x")
    path = hostile.write(tmp_path / filename, doc)
    args = [a.format(f=path, tmp=tmp_path) for a in argv]
    code, _, err = run(capsys, *args)
    assert_user_error(code, err, *fragments, command=args[0])


@pytest.mark.parametrize("argv, fragment", [
    (["simulate", "-w", W, "-c", C, "-p", P, "-n", str(10**9)], "--iterations = '1000000000'"),
    (["simulate", "-w", W, "-c", C, "-p", P, "-n", str(10**30)], "<= 10,000"),
    (["plan", "-w", W, "-c", C, "--budget-evals", str(10**9), "-o", "p.json"], "--budget-evals"),
    (["plan", "-w", W, "-c", C, "--budget-s", "1e300", "-o", "p.json"], "--budget-s"),
], ids=["simulate-n-1e9", "simulate-n-1e30", "budget-evals-1e9", "budget-s-1e300"])
def test_oversize_options_are_refused_while_parsing(capsys, argv, fragment):
    code, _, err = run(capsys, *argv)
    assert_user_error(code, err, fragment, command=argv[0])


def test_simulated_sequences_are_capped(capsys, tmp_path):
    # 8 prompts x 4 responses = 32 sequences per iteration; 10,000 iterations is within the
    # iteration cap, and 320,000 sequences within the simulation's 2**22
    path = hostile.write(tmp_path / "w.yaml", _workload(batch_prompts=4096, responses_per_prompt=64))
    code, _, err = run(capsys, "simulate", "-w", path, "-c", C, "-p", P, "-n", 100)
    assert_user_error(code, err, "--iterations = 100", "262,144 sequences per iteration",
                      command="simulate")


def test_a_mean_a_hair_from_max_with_a_tiny_std_is_priced_as_max(capsys, tmp_path):
    # the audit's case priced 0.08 s per iteration (a 0/0 in the truncated normal): now the
    # lengths are all but surely max, and the estimate equals that of fixed max lengths
    hair = _workload(response_length={"mean": 15.9999, "max": 16, "std": 0.001})
    fixed = _workload(response_length=16)
    seconds = []
    for name, doc in (("hair", hair), ("fixed", fixed)):
        path = hostile.write(tmp_path / f"{name}.yaml", doc)
        code, out, err = run(capsys, "estimate", "-w", path, "-c", C, "-p", P, "--json",
                             "--allow-mismatch")  # (P is made for the unchanged workload)
        assert code == 0, err
        seconds.append(json.loads(out)["iteration_s"])
    assert hostile.finite_positive(seconds[0])
    assert seconds[0] == pytest.approx(seconds[1], rel=1e-3)


def test_the_audits_length_case_at_1024_tokens_is_finite(capsys, tmp_path):
    doc = _workload(response_length={"mean": 1023.9999, "max": 1024, "std": 0.001})
    path = hostile.write(tmp_path / "w.yaml", doc)
    code, out, err = run(capsys, "estimate", "-w", path, "-c", C, "--colocate", "--json")
    assert code == 0, err
    assert hostile.finite_positive(json.loads(out)["iteration_s"])


def test_reading_dev_zero_is_bounded():
    with pytest.raises(SpecError, match="larger than"):
        read_data("/dev/zero", "workload")


def test_anchors_without_aliases_and_plain_files_still_load(tmp_path):
    path = hostile.write(tmp_path / "x.yaml", "a: &x 1\nb: [1, 2]\n")
    assert read_data(path) == {"a": 1, "b": [1, 2]}


def test_regions_and_region_links_are_capped(capsys, tmp_path):
    nodes = [{"gpu": "L4", "count": 1, "region": f"r{i}"} for i in range(65)]
    path = hostile.write(tmp_path / "c.json", _cluster_nodes(*nodes))
    code, _, err = run(capsys, "describe", path)
    assert_user_error(code, err, "nodes = '65 regions'", "at most 64 regions", command="describe")
    links = [{"a": f"r{i}", "b": f"s{i}", "latency_ms": 1, "bandwidth_gbps": 1} for i in range(2017)]
    path = hostile.write(tmp_path / "c.json", _cluster_nodes({"gpu": "L4"}, region_links=links))
    code, _, err = run(capsys, "describe", path)
    assert_user_error(code, err, "region_links = '2017 links'", "at most 2016", command="describe")
