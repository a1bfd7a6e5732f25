"""The ``hetrl`` command, run in-process (plus one real subprocess for the console script)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hetrl.cli import COMMANDS, main
from hetrl.io import save_plan
from hetrl.plan import colocated_plan
from hetrl.spec.presets import CLUSTER_PRESETS, WORKLOAD_PRESETS
from tests.cli_helpers import assert_user_error, run

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CORE_COMMANDS = ("presets", "describe", "validate")






# --- presets -------------------------------------------------------------------------------------

def test_presets_json(capsys):
    code, out, err = run(capsys, "presets", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert set(data) == {"workloads", "clusters", "gpus", "models"}
    assert data["workloads"] == list(WORKLOAD_PRESETS)
    assert len(data["workloads"]) == 24 and "qwen3-14b-grpo-async" in data["workloads"]
    assert "qwen3-30b-a3b-grpo-sync" in data["workloads"]
    assert {"tiny-ppo-sync", "tiny-grpo-async", "tiny-moe-grpo-sync"} <= set(data["workloads"])
    assert data["clusters"] == list(CLUSTER_PRESETS)
    assert {"paper64-single-region", "paper64-multi-region-hybrid", "paper64-multi-country",
            "paper64-multi-continent"} <= set(data["clusters"])
    assert sorted(data["gpus"]) == sorted(["A100-80GB", "A100-40GB", "H100", "H200", "L40S",
                                           "L4", "A10G", "H20", "B200", "GB200", "MI300X",
                                           "L20", "RTX-4090"])
    assert {"Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Qwen3-30B-A3B", "DeepSeek-V3"} <= \
        set(data["models"])


def test_presets_text(capsys):
    code, out, _ = run(capsys, "presets")
    assert code == 0
    assert "paper64-multi-continent" in out
    a100 = next(line for line in out.splitlines() if line.strip().startswith("A100-80GB "))
    assert a100.split() == ["A100-80GB", "312", "TFLOPS", "80", "GB", "2039", "GB/s", "nvlink"]
    qwen = next(line for line in out.splitlines() if line.strip().startswith("Qwen3-8B "))
    assert qwen.split() == ["Qwen3-8B", "8.19", "B", "params"]


# --- describe ------------------------------------------------------------------------------------

def test_describe_multi_continent_json(capsys):
    code, out, _ = run(capsys, "describe", "paper64-multi-continent", "--json")
    assert code == 0
    info = json.loads(out)
    assert info["num_devices"] == 64
    assert info["gpu_types"] == {"A100-80GB": 24, "L40S": 24, "L4": 16}
    assert len(info["regions"]) == 8
    assert set(info["one_way_latency_s"]) == set(info["bandwidth_gbps"]) == {"min", "max"}
    assert 0.0045 <= info["one_way_latency_s"]["min"] < info["one_way_latency_s"]["max"] <= 0.061
    assert info["bandwidth_gbps"] == {"min": pytest.approx(0.83), "max": pytest.approx(5.0)}


def test_describe_cluster_text(capsys):
    code, out, _ = run(capsys, "describe", "paper64-multi-region-hybrid")
    assert code == 0
    assert out.startswith("cluster paper64-multi-region-hybrid: 64 GPUs in 8 nodes, 2 region(s)")
    assert "edge nodes: n6-L4, n7-L4" in out


def test_describe_workload(capsys):
    code, out, _ = run(capsys, "describe", "qwen3-8b-ppo-sync")
    assert code == 0
    assert out.startswith("workload qwen3-8b-ppo-sync: PPO sync")
    assert "384 prompts x 8 responses = 3072 samples" in out
    assert "critic_training" in out
    code, out, _ = run(capsys, "describe", "qwen3-8b-ppo-sync", "--json")
    info = json.loads(out)
    assert info["models"]["actor"]["params"] == 8_190_726_144
    assert len(info["tasks"]) == 6
    assert info["tasks"]["actor_training"]["depends_on"] == [
        "reward_inference", "reference_inference", "critic_inference"]
    assert info["tokens_per_iteration"] == 3072 * (256 + 512)


# --- example files -------------------------------------------------------------------------------

def test_describe_example_cluster(capsys):
    code, out, _ = run(capsys, "describe", str(EXAMPLES / "cluster-mixed.yaml"), "--json")
    assert code == 0
    info = json.loads(out)
    assert info["name"] == "mixed-example"
    assert info["regions"] == ["us-east-1", "us-east-2", "eu-west-1"]
    assert info["gpu_types"] == {"A100-80GB": 16, "L40S": 8, "RTX-A6000": 4, "L4": 8, "H100": 8}
    assert info["edge_nodes"] == ["va-edge-l4.0", "va-edge-l4.1"]
    assert info["bandwidth_gbps"]["min"] == pytest.approx(0.5)   # the edge uplink


def test_describe_example_workload(capsys):
    code, out, _ = run(capsys, "describe", str(EXAMPLES / "workload-ppo-mixed-sizes.yaml"),
                       "--json")
    assert code == 0
    info = json.loads(out)
    assert (info["algorithm"], info["mode"], info["staleness"]) == ("ppo", "async", 1)
    sizes = {role: m["name"] for role, m in info["models"].items()}
    assert sizes == {"actor": "Qwen3-8B", "reference": "Qwen3-8B", "reward": "Qwen3-4B",
                     "critic": "Qwen3-4B"}
    assert info["samples"] == 1024


def test_validate_example_plan(capsys):
    code, out, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                         "-p", str(EXAMPLES / "plan-qwen3-4b-grpo-a100x8.yaml"))
    assert (code, err) == (0, "")
    assert out.strip() == "plan is valid: 4 tasks on 8 devices"


# --- validate ------------------------------------------------------------------------------------

def test_validate_saved_plan(capsys, tmp_path, ppo8b, paper_clusters):
    path = tmp_path / "plan.json"
    save_plan(colocated_plan(ppo8b, paper_clusters["multi-country"], tp=4), path)
    code, out, err = run(capsys, "validate", "-w", "qwen3-8b-ppo-sync",
                         "-c", "paper64-multi-country", "-p", str(path))
    assert (code, err) == (0, "")
    assert out.strip() == "plan is valid: 6 tasks on 64 devices"
    code, out, _ = run(capsys, "validate", "--workload", "qwen3-8b-ppo-sync",
                       "--cluster", "paper64-multi-country", "--plan", str(path), "--json")
    assert code == 0
    assert json.loads(out) == {"valid": True, "tasks": list(ppo8b.task_names), "devices": 64}


def test_validate_with_spec_files(capsys, tmp_path, grpo4b, a100x8):
    (tmp_path / "w.json").write_text(json.dumps(grpo4b.to_dict()))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(a100x8.to_dict()))
    save_plan(colocated_plan(grpo4b, a100x8, tp=8), tmp_path / "p.yaml")
    code, out, _ = run(capsys, "validate", "-w", str(tmp_path / "w.json"),
                       "-c", str(tmp_path / "c.yaml"), "-p", str(tmp_path / "p.yaml"))
    assert code == 0 and "valid" in out


# --- bad input: exit code 2, one line, no traceback ----------------------------------------------

def test_unknown_preset(capsys):
    code, _, err = run(capsys, "describe", "paper128-moon")
    assert_user_error(code, err, "hetrl describe: error:", "paper128-moon", "hetrl presets")
    code, _, err = run(capsys, "validate", "-w", "qwen3-70b-ppo-sync", "-c", "a100x8",
                       "-p", "plan.json")
    assert_user_error(code, err, "workload = 'qwen3-70b-ppo-sync'", "neither a preset nor a file")


def test_malformed_file(capsys, tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: [{gpu: A100, count: 8\n")
    code, _, err = run(capsys, "describe", str(path))
    assert_user_error(code, err, "malformed yaml")
    plan = tmp_path / "plan.json"
    plan.write_text("{\"groups\": [")
    code, _, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                       "-p", str(plan))
    assert_user_error(code, err, "malformed json")


def test_unreadable_and_ambiguous_files(capsys, tmp_path):
    # not UTF-8: one line, not a UnicodeDecodeError
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe")
    code, _, err = run(capsys, "describe", str(binary))
    assert_user_error(code, err, "bin.yaml", "not UTF-8 text")
    # a malformed file names the line and column
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n  - {gpu: A100, count: 8\n")
    code, _, err = run(capsys, "describe", str(path))
    assert_user_error(code, err, "malformed yaml", "line 3, column 1")
    # a repeated key would silently win: an error, in YAML and in JSON
    workload = yaml.safe_load((EXAMPLES / "workload-ppo-mixed-sizes.yaml").read_text())
    dup = tmp_path / "w.yaml"
    dup.write_text(yaml.safe_dump(workload) + "batch_prompts: 8\n")
    code, _, err = run(capsys, "describe", str(dup))
    assert_user_error(code, err, "duplicate key 'batch_prompts'", "line")
    dup_json = tmp_path / "p.json"
    dup_json.write_text('{"groups": [], "groups": []}')
    code, _, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                       "-p", str(dup_json))
    assert_user_error(code, err, "duplicate key 'groups'")
    # a string where a boolean belongs is not read as true
    workload["recompute"] = "false"
    path = tmp_path / "w2.yaml"
    path.write_text(yaml.safe_dump(workload))
    code, _, err = run(capsys, "describe", str(path))
    assert_user_error(code, err, "recompute = 'false'", "true or false")


def test_option_values_are_checked_before_any_work(capsys, tmp_path):
    est = ("estimate", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8", "--colocate")
    code, _, err = run(capsys, *est, "--tp", "0")
    assert_user_error(code, err, "hetrl estimate: error: --tp = '0': must be an integer >= 1")
    code, _, err = run(capsys, *est, "--pp", "x")
    assert_user_error(code, err, "--pp = 'x'")
    plan = ("plan", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8", "-o", str(tmp_path / "p.json"))
    code, _, err = run(capsys, *plan, "--budget-evals", "5", "--seed", "-1")
    assert_user_error(code, err, "--seed = '-1': must be an integer >= 0")
    code, _, err = run(capsys, *plan, "--budget-s", "inf")
    assert_user_error(code, err, "--budget-s = 'inf': must be a finite number > 0")
    # output paths: a directory, or under a file, fail at once (not after the search)
    code, _, err = run(capsys, "plan", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8",
                       "--budget-evals", "5", "-o", str(tmp_path))
    assert_user_error(code, err, "--out", "is a directory")
    (tmp_path / "file").write_text("")
    code, _, err = run(capsys, *est, "--save-plan", str(tmp_path / "file" / "x.json"))
    assert_user_error(code, err, "--save-plan", "is not a directory")
    # a plan's layouts are its own
    code, _, err = run(capsys, "estimate", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8", "-p",
                       str(tmp_path / "p.json"), "--tp", "8")
    assert_user_error(code, err, "--tp, --pp, --dp and --ep go with --colocate")


def test_written_files_follow_the_umask(capsys, tmp_path):
    import os

    old = os.umask(0o022)
    try:
        code, _, _ = run(capsys, "estimate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                         "--colocate", "--save-plan", str(tmp_path / "plan.json"))
    finally:
        os.umask(old)
    assert code == 0
    assert (tmp_path / "plan.json").stat().st_mode & 0o777 == 0o644


def test_params_for_an_unknown_gpu_type_are_an_error(capsys, tmp_path):
    est = ("estimate", "-w", "qwen3-8b-ppo-sync", "-c", "a100x8", "--colocate", "--tp", "4")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"per_gpu": {"B300": {"train_flops": 0.05}}}))
    code, _, err = run(capsys, *est, "--params", str(path))
    assert_user_error(code, err, "params.per_gpu.B300", "unknown GPU type", "A100-80GB")
    # a built-in short name means its type, as in cluster files
    path.write_text(yaml.safe_dump({"per_gpu": {"A100": {"train_flops": 0.05}}}))
    code, out, _ = run(capsys, *est, "--params", str(path), "--json")
    slow = json.loads(out)["iteration_s"]
    code, out, _ = run(capsys, *est, "--json")
    assert slow > 2 * json.loads(out)["iteration_s"]


def test_bad_field_in_a_spec_file(capsys, tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"gpu": "A100", "region": "x"},
                                              {"gpu": "L4", "region": "y"}],
                                    "region_links": [{"a": "x", "b": "y", "latency_ms": 60000,
                                                      "bandwidth_gbps": 1}]}))
    code, _, err = run(capsys, "describe", str(path))
    assert_user_error(code, err, "cluster.yaml: region_links[0].latency_ms = 60000",
                      "units: milliseconds")


def test_invalid_plan(capsys, tmp_path, grpo4b, a100x8):
    d = colocated_plan(grpo4b, a100x8, tp=2).to_dict()
    d["placements"][0]["tp"] = 3
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(d))
    code, out, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                         "-p", str(path))
    assert out == ""
    assert_user_error(code, err,
                      "hetrl validate: error: plan.yaml: placements[actor_generation].tp = 3",
                      "must divide Qwen3-4B's 32 attention heads")
    # a misspelt task is named as such
    d = colocated_plan(grpo4b, a100x8, tp=2).to_dict()
    d["placements"][0]["task"] = "actor_gen"
    path.write_text(yaml.safe_dump(d))
    code, out, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                         "-p", str(path))
    assert_user_error(code, err, "plan.yaml: placements[0].task = 'actor_gen'", "not a task")


def test_plan_for_another_cluster(capsys, tmp_path, grpo4b, paper_clusters):
    path = tmp_path / "plan.json"
    save_plan(colocated_plan(grpo4b, paper_clusters["single-region"]), path)
    code, _, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                       "-p", str(path))
    assert_user_error(code, err, "plan.json: made_for.cluster = 'paper64-single-region'",
                      "the cluster given is 'a100x8'", "--allow-mismatch")
    # used anyway, it does not fit: the first field that does not fit, in one line
    code, _, err = run(capsys, "validate", "-w", "qwen3-4b-grpo-sync", "-c", "a100x8",
                       "-p", str(path), "--allow-mismatch")
    assert_user_error(code, err, "groups[0].devices = 8", "no such device in cluster 'a100x8'")


def test_missing_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate", "-w", "qwen3-4b-grpo-sync"])
    assert exc.value.code == 2
    assert "required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


# --- help ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CORE_COMMANDS)
def test_core_subcommand_help(capsys, name):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: hetrl {name}")
    assert "--json" in out


@pytest.mark.parametrize("name, trace", [("simulate", "Chrome trace JSON (open it in Perfetto)"),
                                         ("run", "hetrl's Trace schema, JSON (the input of "
                                                 "hetrl calibrate)")])
def test_simulate_and_run_spell_each_trace_format_alike(capsys, name, trace):
    """--chrome-trace and --trace-raw mean one format each in both commands; --trace keeps the
    format it always had in each (simulate: Chrome, run: raw), and --help says which."""
    with pytest.raises(SystemExit):
        main([name, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"--trace FILE write the trace as {trace}, as" in text
    assert ("--chrome-trace FILE write the trace as Chrome trace JSON (open it in Perfetto)"
            in text)
    assert ("--trace-raw FILE write the trace as hetrl's Trace schema, JSON (the input of "
            "hetrl calibrate)" in text)


def test_every_registered_subcommand_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert set(CORE_COMMANDS) <= set(COMMANDS)
    for name, (help_text, _, _) in COMMANDS.items():
        assert name in top and help_text
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: hetrl {name}")


def test_console_script(tmp_path):
    script = Path(sys.executable).with_name("hetrl")
    assert script.exists(), f"console script not installed next to {sys.executable}"
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: hetrl")
    for name in CORE_COMMANDS:
        assert name in proc.stdout
    # a command that returns: console_main freezes the objects and passes its code on
    proc = subprocess.run([str(script), "schedulers"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "hetrl-simple" in proc.stdout
    proc = subprocess.run([str(script), "plan", "--workload", "qwen3-8b-ppo-sync", "--cluster",
                           "a100x8", "--scheduler", "nope", "--budget-evals", "5", "--out",
                           str(tmp_path / "plan.json")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "unknown" in proc.stderr and "Traceback" not in proc.stderr


def test_python_dash_m_has_every_command(capsys):
    # Regression: under `python -m hetrl.cli` commands registered from other modules were missing.
    main_help = subprocess.run([sys.executable, "-m", "hetrl.cli", "--help"], capture_output=True,
                               text=True, timeout=60, check=True).stdout
    with pytest.raises(SystemExit):
        main(["--help"])  # loads every command module into COMMANDS
    listed = set(re.findall(r"^    (\S+)", main_help, flags=re.MULTILINE))
    for name in COMMANDS:
        assert name in listed


def test_plan_json_is_strict_json(capsys, tmp_path):
    # verl's history starts with infeasible bests (inf): JSON has no Infinity, so null
    code, out, _ = run(capsys, "plan", "-w", "qwen3-4b-grpo-sync", "-c", "hetero8-two-region",
                       "-s", "verl", "--budget-evals", "300", "-o", str(tmp_path / "p.json"),
                       "--json")
    assert code == 0

    def reject(constant):
        raise ValueError(f"not JSON: {constant}")
    data = json.loads(out, parse_constant=reject)
    assert any(best is None for _, _, best in data["history"])
    assert data["iteration_s"] > 0


def test_a_simulated_trace_calibrates(capsys, tmp_path):
    # docs/real.md: `hetrl simulate --trace-raw` output is an input of `hetrl calibrate`
    plan, trace = tmp_path / "plan.json", tmp_path / "sim.json"
    spec = ("-w", "tiny-grpo-sync", "-c", "tiny4-single-region")
    assert run(capsys, "estimate", *spec, "--colocate", "--save-plan", str(plan))[0] == 0
    assert run(capsys, "simulate", *spec, "-p", str(plan), "-n", "2", "--trace-raw",
               str(trace))[0] == 0
    meta = json.loads(trace.read_text())["meta"]
    assert {"workload_spec", "cluster_spec", "plan"} <= set(meta)
    code, out, err = run(capsys, "calibrate", "--traces", str(trace), "--out",
                         str(tmp_path / "params.yaml"), "--json")
    assert code == 0, err
    assert len(json.loads(out)["runs"]) == 1


def test_describe_names_the_nodes_and_rejects_other_files(capsys, tmp_path):
    code, out, _ = run(capsys, "describe", "paper64-multi-country", "--json")
    nodes = json.loads(out)["nodes"]
    assert [n["devices"] for n in nodes[:2]] == [[0, 7], [8, 15]]
    assert nodes[0]["name"] == "n0-A100-80GB"  # the name fault files use
    code, out, _ = run(capsys, "describe", "paper64-multi-country")
    assert "n7-L4: 8 x L4" in out
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"per_gpu": {"A100": {"train_flops": 0.5}}}))
    code, _, err = run(capsys, "describe", str(params))
    assert_user_error(code, err, "neither a cluster", "its keys: ['per_gpu']")
