"""``hetrl simulate`` in-process: JSON output consistent with ``hetrl estimate``, Chrome and raw
traces, fault files, and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import json

import pytest
import yaml

from hetrl.io import load_cluster, load_workload, save_plan
from hetrl.plan import colocated_plan
from hetrl.trace import Trace
from tests import cli_helpers
from tests.cli_helpers import run
from tests.sim.tiny import TINY


def assert_user_error(code, err, *fragments):
    """A user error of ``hetrl simulate`` (the line names the command)."""
    return cli_helpers.assert_user_error(code, err, *fragments, command="simulate:")


@pytest.fixture
def files(tmp_path):
    """A tiny PPO workload, a 2-GPU cluster and a colocated plan, as files."""
    wl_data = {"name": "tiny-ppo", "algorithm": "ppo", "model": TINY.to_dict(),
               "batch_prompts": 2, "responses_per_prompt": 2,
               "prompt_length": {"mean": 12, "max": 24, "min": 4, "std": 6},
               "response_length": {"mean": 10, "max": 20, "min": 2, "std": 6}}
    cl_data = {"name": "two", "nodes": [{"name": "n0", "gpu": "A100-80GB", "count": 2,
                                         "region": "r0"}]}
    w, c, p = tmp_path / "w.yaml", tmp_path / "c.yaml", tmp_path / "plan.json"
    w.write_text(yaml.safe_dump(wl_data))
    c.write_text(yaml.safe_dump(cl_data))
    save_plan(colocated_plan(load_workload(w), load_cluster(c), tp=2), p)  # made for them
    return {"w": str(w), "c": str(c), "p": str(p), "dir": tmp_path}


def base(files, *extra):
    return ["simulate", "--workload", files["w"], "--cluster", files["c"], "--plan", files["p"],
            *extra]


def test_json_output(capsys, files):
    code, out, err = run(capsys, *base(files, "--iterations", "3", "--seed", "2", "--json"))
    assert code == 0, err
    d = json.loads(out)
    assert len(d["iterations"]) == 3 and d["completed_iterations"] == 3
    assert d["iteration_s"] == pytest.approx(sum(d["iterations"][1:]) / 2, rel=1e-12)
    code, out, err = run(capsys, "estimate", "--workload", files["w"], "--cluster", files["c"],
                         "--plan", files["p"], "--json")
    assert code == 0, err
    est = json.loads(out)
    assert list(d["tasks"]) == list(est["tasks"])  # the same names in the same order
    # co-located, one layout: no weights move; the engine's sleep and wake remain, as estimated
    assert d["tasks"]["critic_training"] > 0
    assert d["tasks"]["weight_sync"] == pytest.approx(est["tasks"]["weight_sync"], rel=1e-9)
    assert d["faults"]["stalled"] is False and d["faults"]["lost_devices"] == []
    assert len(d["per_iteration"]) == 3
    # the seed matters, and only the seed
    again = json.loads(run(capsys, *base(files, "--iterations", "3", "--seed", "2", "--json"))[1])
    other = json.loads(run(capsys, *base(files, "--iterations", "3", "--seed", "3", "--json"))[1])
    assert again == d and other["iterations"] != d["iterations"]


def test_text_output(capsys, files):
    code, out, err = run(capsys, *base(files, "-n", "2"))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("tiny-ppo on two: ") and "s per iteration" in lines[0]
    assert "2/2 done" in lines[0]
    assert lines[1].startswith("  iterations: ")
    for task in ("actor_generation", "critic_training", "weight_sync"):
        assert any(line.strip().startswith(task) for line in lines)


def test_chrome_and_raw_traces(capsys, files):
    chrome, raw = files["dir"] / "t.json", files["dir"] / "raw.json"
    code, _, err = run(capsys, *base(files, "-n", "2", "--trace", str(chrome),
                                     "--trace-raw", str(raw)))
    assert code == 0, err
    data = json.loads(chrome.read_text())
    events = data["traceEvents"]
    assert events and all(e["ph"] in ("X", "M") for e in events)
    x = [e for e in events if e["ph"] == "X"]
    assert x and all(e["dur"] >= 0 and isinstance(e["pid"], int) for e in x)
    assert {e["cat"] for e in x} >= {"task", "tasklet"}
    trace = Trace.from_dict(json.loads(raw.read_text()))
    assert trace.source == "sim" and len(trace.iterations) == 2


def test_chrome_trace_and_trace_raw_spell_the_formats_as_hetrl_run_does(capsys, files):
    """--chrome-trace writes what --trace writes (Chrome JSON); --trace-raw loads with hetrl
    calibrate's loader."""
    from hetrl.calibrate import load_trace

    d = files["dir"]
    code, _, err = run(capsys, *base(files, "-n", "2", "--trace", str(d / "t.json"),
                                     "--chrome-trace", str(d / "c.json"),
                                     "--trace-raw", str(d / "r.json")))
    assert code == 0, err
    assert json.loads((d / "c.json").read_text()) == json.loads((d / "t.json").read_text())
    assert json.loads((d / "c.json").read_text())["traceEvents"]
    trace = load_trace(d / "r.json")
    assert trace.source == "sim" and len(trace.iterations) == 2
    assert {"workload_spec", "cluster_spec", "plan"} <= set(trace.meta)
    assert not list(d.glob(".*.tmp"))  # written atomically: no temporary file left


def test_faults_file(capsys, files):
    straggler = files["dir"] / "s.yaml"
    straggler.write_text(yaml.safe_dump(
        {"events": [{"at_s": 0, "kind": "straggler", "device": 1, "slowdown": 3}]}))
    plain = json.loads(run(capsys, *base(files, "-n", "2", "--json"))[1])
    code, out, err = run(capsys, *base(files, "-n", "2", "--json", "--faults", str(straggler)))
    assert code == 0, err
    assert json.loads(out)["iteration_s"] > plain["iteration_s"]
    lost = files["dir"] / "l.yaml"
    lost.write_text(yaml.safe_dump({"events": [{"at_s": 1e-4, "kind": "device_lost",
                                                "device": 0}]}))
    code, out, err = run(capsys, *base(files, "-n", "2", "--faults", str(lost)))
    assert code == 4, err  # stalled: answered, exit 4 (tests/sim/test_cli_faults.py)
    assert out.startswith("STALLED: ") and "0/2 iterations done" in out
    assert "faults: lost devices [0]" in out and "stalled True" in out and "nan" not in out


def test_bad_input_is_one_line_exit_2(capsys, files):
    bad_plan = files["dir"] / "bad.json"
    d = json.loads(open(files["p"]).read())
    d["groups"][0]["devices"] = [0, 7]
    bad_plan.write_text(json.dumps(d))
    code, _, err = run(capsys, "simulate", "-w", files["w"], "-c", files["c"], "-p", str(bad_plan))
    assert_user_error(code, err, "groups[0].devices", "7")
    bad_faults = files["dir"] / "f.yaml"
    bad_faults.write_text(yaml.safe_dump({"events": [{"at_s": 0, "kind": "meteor"}]}))
    code, _, err = run(capsys, *base(files, "--faults", str(bad_faults)))
    assert_user_error(code, err, "faults.events[0].kind", "meteor")
    bad_faults.write_text(yaml.safe_dump({"events": [{"at_s": 0, "kind": "straggler",
                                                      "device": 9, "slowdown": 2}]}))
    code, _, err = run(capsys, *base(files, "--faults", str(bad_faults)))
    assert_user_error(code, err, "faults.events[0].device")
    code, _, err = run(capsys, *base(files, "--faults", str(files["dir"] / "missing.yaml")))
    assert_user_error(code, err, "missing.yaml")
    code, _, err = run(capsys, *base(files, "--iterations", "0"))
    assert_user_error(code, err, "--iterations")
