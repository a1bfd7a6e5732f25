"""What a plan is for: fingerprints of workloads and clusters, ``made_for`` in plan files, and
the commands that refuse a plan made for another workload or cluster (exit 2, unless
``--allow-mismatch``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hetrl.cli import COMMANDS, _load_command_modules, build_parser, main
from hetrl.errors import PlanMismatchError, SpecError
from hetrl.fingerprint import (
    FINGERPRINT_CHARS,
    MadeFor,
    SpecMark,
    check_plan_for,
    cluster_fingerprint,
    made_for,
    workload_fingerprint,
)
from hetrl.io import load_cluster, load_plan, load_workload, save_plan
from hetrl.plan import Plan, colocated_plan
from hetrl.spec.presets import cluster_preset, workload_preset
from tests.cli_helpers import assert_user_error, run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

CLUSTER_YAML = """\
name: mine
nodes:
  - {name: a, gpu: A100-80GB, count: 4, region: us-east-1}
  - {name: b, gpu: L40S, count: 4, region: us-east-2}
region_links:
  - {a: us-east-1, b: us-east-2, latency_ms: 6, bandwidth_gbps: 5}
"""
# the same fleet: other key order, flow/block style, comments, 6.0 for 6, the link's ends
# swapped, other node names, another name, a link to a region no node is in, prices
CLUSTER_YAML_COSMETIC = """\
# my fleet, rewritten
region_links:
  - bandwidth_gbps: 5.0   # Gbit/s
    latency_ms: 6.0
    b: us-east-1
    a: us-east-2
nodes:
  - {region: us-east-1, count: 4, gpu: A100-80GB, name: first}
  - gpu: L40S
    region: us-east-2
    count: 4
name: renamed
prices: {gpu_hour: {L40S: 1.5}}
"""
WORKLOAD_YAML = """\
name: job
algorithm: grpo
model: Qwen3-4B
batch_prompts: 64
responses_per_prompt: 4
prompt_length: {mean: 256, max: 1024, min: 16, std: 128}
response_length: {mean: 512, max: 1024, min: 16, std: 256}
"""
WORKLOAD_YAML_COSMETIC = """\
# the same job
response_length: {std: 256, min: 16, max: 1024, mean: 512.0}
prompt_length:
  std: 128
  min: 16
  max: 1024
  mean: 256
responses_per_prompt: 4
batch_prompts: 64
model: Qwen3-4B
algorithm: grpo
name: another-name
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- fingerprints --------------------------------------------------------------------------------

def test_a_fingerprint_is_16_hex_digits_and_differs_between_kinds(grpo4b, a100x8):
    for fp in (cluster_fingerprint(a100x8), workload_fingerprint(grpo4b)):
        assert len(fp) == FINGERPRINT_CHARS == 16 and set(fp) <= set("0123456789abcdef")
    assert cluster_fingerprint(a100x8) == cluster_fingerprint(cluster_preset("a100x8"))


def test_cosmetic_changes_keep_the_fingerprint(tmp_path):
    c1 = load_cluster(_write(tmp_path, "c1.yaml", CLUSTER_YAML))
    c2 = load_cluster(_write(tmp_path, "c2.yaml", CLUSTER_YAML_COSMETIC))
    assert cluster_fingerprint(c1) == cluster_fingerprint(c2)
    c3 = load_cluster(_write(tmp_path, "c3.json", json.dumps(c1.to_dict())))  # JSON, repeat-free
    assert cluster_fingerprint(c3) == cluster_fingerprint(c1)
    w1 = load_workload(_write(tmp_path, "w1.yaml", WORKLOAD_YAML))
    w2 = load_workload(_write(tmp_path, "w2.yaml", WORKLOAD_YAML_COSMETIC))
    assert workload_fingerprint(w1) == workload_fingerprint(w2)


def test_what_a_plan_depends_on_changes_the_fingerprint(tmp_path):
    base = load_cluster(_write(tmp_path, "c.yaml", CLUSTER_YAML))
    fp = cluster_fingerprint(base)
    for old, new in (("gpu: L40S", "gpu: L4"),                   # a GPU type
                     ("count: 4, region: us-east-2", "count: 2, region: us-east-2"),  # GPUs
                     ("us-east-2", "us-west-2"),                  # a region
                     ("bandwidth_gbps: 5", "bandwidth_gbps: 10"),  # a link
                     ("latency_ms: 6", "latency_ms: 60")):
        changed = load_cluster(_write(tmp_path, "c2.yaml", CLUSTER_YAML.replace(old, new)))
        assert cluster_fingerprint(changed) != fp, (old, new)
    swapped = replace(base, nodes=base.nodes[::-1])  # device order: ids name other GPUs
    assert cluster_fingerprint(swapped) != fp
    wl = load_workload(_write(tmp_path, "w.yaml", WORKLOAD_YAML))
    for old, new in (("batch_prompts: 64", "batch_prompts: 128"),
                     ("model: Qwen3-4B", "model: Qwen3-8B"),
                     ("response_length: {mean: 512, max: 1024", "response_length: {mean: 512, "
                                                                 "max: 2048"),
                     ("algorithm: grpo", "algorithm: ppo")):
        changed = load_workload(_write(tmp_path, "w2.yaml", WORKLOAD_YAML.replace(old, new)))
        assert workload_fingerprint(changed) != workload_fingerprint(wl), (old, new)


def test_the_fingerprint_is_the_same_in_another_process():
    code = ("from hetrl.spec.presets import cluster_preset, workload_preset\n"
            "from hetrl.fingerprint import cluster_fingerprint, workload_fingerprint\n"
            "print(cluster_fingerprint(cluster_preset('paper64-multi-continent')), "
            "workload_fingerprint(workload_preset('qwen3-8b-ppo-async')))")
    for seed in ("1", "12345"):  # str hashes differ between these processes
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True, cwd=ROOT).stdout.split()
        assert out == [cluster_fingerprint(cluster_preset("paper64-multi-continent")),
                       workload_fingerprint(workload_preset("qwen3-8b-ppo-async"))]


# --- made_for in plan files ----------------------------------------------------------------------

def test_made_for_round_trips_and_is_not_part_of_plan_equality(tmp_path, grpo4b, a100x8):
    plan = colocated_plan(grpo4b, a100x8, tp=2)
    assert plan.made_for == made_for(grpo4b, a100x8)
    data = plan.to_dict()
    assert data["made_for"] == {
        "workload": {"name": "qwen3-4b-grpo-sync", "fingerprint": workload_fingerprint(grpo4b)},
        "cluster": {"name": "a100x8", "fingerprint": cluster_fingerprint(a100x8)}}
    assert list(data)[:2] == ["schema_version", "provenance"]  # the old keys stay as they were
    for name in ("p.json", "p.yaml"):
        save_plan(plan, tmp_path / name)
        back = load_plan(tmp_path / name, grpo4b, a100x8)
        assert back.made_for == plan.made_for and back == plan
    assert replace(plan, made_for=None) == plan  # metadata: the same plan


def test_bad_made_for_fields_are_named(grpo4b, a100x8):
    good = colocated_plan(grpo4b, a100x8, tp=2).to_dict()
    for made, fragment in (({"fleet": {}}, "made_for.fleet"),
                           ({"cluster": {"name": "x"}}, "made_for.cluster"),
                           ({"cluster": {"name": "x", "fingerprint": "abc"}},
                            "made_for.cluster.fingerprint"),
                           ({"cluster": {"name": "x", "fingerprint": 1234567890123456}},
                            "quote it in YAML"),
                           ({"cluster": []}, "at least one"),
                           ({"workload": [{"name": "", "fingerprint": "0" * 16}]},
                            "made_for.workload[0].name")):
        with pytest.raises(SpecError) as exc:
            Plan.from_dict({**good, "made_for": made})
        assert fragment in str(exc.value), str(exc.value)


def test_check_plan_for_in_the_library(grpo4b, a100x8, paper_clusters):
    plan = colocated_plan(grpo4b, a100x8, tp=2)
    assert check_plan_for(plan.made_for, grpo4b, a100x8) is None
    other = paper_clusters["single-region"]
    with pytest.raises(PlanMismatchError) as exc:
        check_plan_for(plan.made_for, grpo4b, other, cluster_name="mine.yaml")
    assert exc.value.field == "made_for.cluster" and exc.value.value == "a100x8"
    assert "'mine.yaml'" in str(exc.value) and cluster_fingerprint(other) in str(exc.value)
    warning = check_plan_for(plan.made_for, grpo4b, other, allow_mismatch=True)
    assert "used anyway" in warning and "\n" not in warning
    assert "no workload or cluster fingerprint" in check_plan_for(None, grpo4b, a100x8)
    # a hand-written plan may be made for several clusters
    several = MadeFor(plan.made_for.workload, (SpecMark("other", cluster_fingerprint(other)),
                                                *plan.made_for.cluster))
    assert check_plan_for(several, grpo4b, other) is None
    assert check_plan_for(several, grpo4b, a100x8) is None


# --- the commands --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def multi_country_plan(tmp_path_factory):
    """The issue's case: a plan made for paper64-multi-country, written by `hetrl estimate`."""
    path = tmp_path_factory.mktemp("plans") / "p64.json"
    code = main(
        ["estimate", "-w", "qwen3-4b-ppo-sync", "-c", "paper64-multi-country", "--colocate",
         "--tp", "4", "--save-plan", str(path), "--json"])
    assert code == 0
    return path


def test_a_written_plan_records_the_names_given(multi_country_plan):
    made = json.loads(multi_country_plan.read_text())["made_for"]
    assert made["workload"]["name"] == "qwen3-4b-ppo-sync"
    assert made["cluster"] == {"name": "paper64-multi-country", "fingerprint": cluster_fingerprint(
        cluster_preset("paper64-multi-country"))}


@pytest.mark.parametrize("command", ["validate", "estimate"])
def test_a_plan_for_another_cluster_or_workload_is_exit_2(capsys, multi_country_plan, command):
    p = str(multi_country_plan)
    code, out, err = run(capsys, command, "-w", "qwen3-4b-ppo-sync", "-c",
                         "paper64-single-region", "-p", p)  # 64 GPUs too: it would validate
    assert out == ""
    assert_user_error(code, err, f"hetrl {command}: error: p64.json: made_for.cluster = "
                      "'paper64-multi-country'", "the cluster given is 'paper64-single-region'",
                      cluster_fingerprint(cluster_preset("paper64-single-region")),
                      "--allow-mismatch")
    code, out, err = run(capsys, command, "-w", "qwen3-4b-grpo-sync", "-c",
                         "paper64-multi-country", "-p", p)
    assert_user_error(code, err, "made_for.workload = 'qwen3-4b-ppo-sync'",
                      "the workload given is 'qwen3-4b-grpo-sync'")
    code, out, err = run(capsys, command, "-w", "qwen3-4b-ppo-sync", "-c",
                         "paper64-single-region", "-p", p, "--allow-mismatch", "--json")
    assert code == 0 and json.loads(out)
    assert err.startswith(f"hetrl {command}: warning: p64.json: made_for.cluster")
    assert len(err.strip().splitlines()) == 1 and "used anyway" in err
    code, out, err = run(capsys, command, "-w", "qwen3-4b-ppo-sync", "-c",
                         "paper64-multi-country", "-p", p, "--json")
    assert (code, err) == (0, "")


def test_a_spec_file_is_named_by_its_file_name(capsys, tmp_path):
    c = _write(tmp_path, "fleet.yaml", CLUSTER_YAML)
    p = tmp_path / "plan.yaml"
    code, _, err = run(capsys, "estimate", "-w", "qwen3-4b-grpo-sync", "-c", c, "--colocate",
                       "--save-plan", p)
    assert code in (0, 3), err  # (3: it does not fit; written all the same)
    assert yaml.safe_load(p.read_text())["made_for"]["cluster"]["name"] == "fleet.yaml"
    # the same fleet written another way is the same cluster
    code, _, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync",
                       "-c", _write(tmp_path, "same.yaml", CLUSTER_YAML_COSMETIC), "-p", p)
    assert (code, err) == (0, "")
    code, _, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync",
                       "-c", _write(tmp_path, "l4.yaml", CLUSTER_YAML.replace("L40S", "L4")),
                       "-p", p)
    assert_user_error(code, err, "made_for.cluster = 'fleet.yaml'", "given is 'l4.yaml'")


def test_an_old_plan_loads_with_a_one_line_warning(capsys, tmp_path, grpo4b, a100x8):
    data = colocated_plan(grpo4b, a100x8, tp=2).to_dict()
    del data["made_for"]
    path = _write(tmp_path, "old.json", json.dumps(data))
    for command in ("validate", "estimate"):
        code, out, err = run(capsys, command, "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                             "-p", path)
        assert code == 0 and out
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"hetrl {command}: warning: old.json: ")
        assert "no workload or cluster fingerprint" in lines[0]
    # a refusal stays one line: the error, no warning before it
    data["placements"][0]["tp"] = 3
    code, _, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                       "-p", _write(tmp_path, "old.json", json.dumps(data)))
    assert_user_error(code, err, "old.json: placements[actor_generation].tp = 3")


def test_a_search_writes_made_for(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8", "-s",
                       "random", "--budget-evals", 5, "--seed", 0, "-o", out)
    assert code == 0, err
    made = json.loads(out.read_text())["made_for"]
    assert made == made_for(workload_preset("qwen3-4b-grpo-sync"),
                            cluster_preset("a100x8")).to_dict()
    code, _, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync", "-c",
                       "paper24-a100-single-region", "-p", out)
    assert_user_error(code, err, "made_for.cluster = 'a100x8'")


@pytest.mark.parametrize("command", ["validate", "estimate", "simulate", "run", "show",
                                     "export"])
def test_every_command_reading_a_plan_documents_allow_mismatch(capsys, command):
    _load_command_modules()
    assert command in COMMANDS
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--help"])
    assert "--allow-mismatch" in capsys.readouterr().out


def test_the_example_plans_record_their_presets():
    for path in sorted(EXAMPLES.glob("plan-*.yaml")):
        plan = load_plan(path)
        assert plan.made_for is not None and plan.made_for.workload and plan.made_for.cluster
        for mark in plan.made_for.workload:
            assert mark.fingerprint == workload_fingerprint(workload_preset(mark.name)), path
        for mark in plan.made_for.cluster:
            assert mark.fingerprint == cluster_fingerprint(cluster_preset(mark.name)), path


def test_the_fingerprints_in_the_docs_are_current():
    import re

    text = (ROOT / "docs" / "specs.md").read_text()
    found = re.findall(r"\{name: ([\w-]+), fingerprint: ([0-9a-f]{16})\}", text)
    found += re.findall(r"'([\w-]+)' \(fingerprint ([0-9a-f]{16})\)", text)
    found += re.findall(r"made_for\.cluster = '([\w-]+)': the plan was made for this cluster "
                        r"\(fingerprint ([0-9a-f]{16})\)", text)
    assert len(found) >= 4
    for name, fp in found:
        spec_fp = (cluster_fingerprint(cluster_preset(name)) if name.startswith(("a100", "paper"))
                   else workload_fingerprint(workload_preset(name)))
        assert fp == spec_fp, name
