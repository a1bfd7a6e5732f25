"""``hetrl simulate`` with faults, as users read it (issue 28): a stall says where and when and
exits 4; phases before, during and after the first fault with throughput; guards and extreme
fault values are one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hetrl.cli_sim import EXIT_STALLED
from hetrl.spec.presets import workload_preset
from tests.cli_helpers import assert_user_error, run

PLAN = Path(__file__).resolve().parents[2] / "examples" / "plan-tiny-grpo-tiny4.yaml"
JOB = ["simulate", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region", "-p", str(PLAN)]
LOST = {"at_s": 0.8, "kind": "device_lost", "device": 2}  # during iteration 2 (0.56 s each)


def faults(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_stall_says_where_and_when_and_exits_4(capsys, tmp_path):
    code, out, err = run(capsys, *JOB, "-n", "3", "--faults", faults(tmp_path, {"events": [LOST]}))
    assert code == EXIT_STALLED == 4 and err == ""
    first = out.splitlines()[0]
    assert first == ("STALLED: tiny-grpo-sync on tiny4-two-region: device 2 (node n1-L4, region "
                     "eu-west-1) lost at 0.80 s (simulated) during iteration 2, and the faults "
                     "file has no replan; 1/3 iterations done")
    assert "nan" not in out
    assert "after: stalled" in out and "before: 1 iteration(s)" in out
    code, out, _ = run(capsys, *JOB, "-n", "3", "--json",
                       "--faults", faults(tmp_path, {"events": [LOST]}))
    d = json.loads(out)
    assert code == 4 and d["stalled"] is True
    assert d["iteration_s"] == pytest.approx(d["iterations"][0])  # the one iteration done
    assert d["faults"]["stalled_at_s"] == 0.8 and d["faults"]["aborted_iterations"] == [1]
    ph = d["phases"]
    assert ph["fault_at_s"] == 0.8 and ph["stalled_at_s"] == 0.8 and ph["replan_s"] is None
    assert ph["before_fault"]["iterations"] == 1 and ph["after_fault"]["iterations"] == 0
    assert ph["after_fault"]["throughput_samples_per_s"] is None


def test_a_stall_in_the_first_iteration_prints_no_zero_task_times(capsys, tmp_path):
    lost = {**LOST, "at_s": 0.01}
    code, out, _ = run(capsys, *JOB, "-n", "2", "--faults", faults(tmp_path, {"events": [lost]}))
    assert code == 4
    assert "during iteration 1" in out and "0/2 iterations done" in out
    assert "no iteration completed" in out and " 0.00 s" not in out


def test_phases_split_the_run_at_the_fault_with_throughput(capsys, tmp_path):
    scenario = {"events": [LOST], "replan": {"scheduler": "random", "budget_evals": 20,
                                             "delay_s": 1.0}}
    code, out, err = run(capsys, *JOB, "-n", "5", "--json", "--faults", faults(tmp_path, scenario))
    assert code == 0, err
    d = json.loads(out)
    ph = d["phases"]
    assert ph["replan_s"] == 1.0
    before, during, after = ph["before_fault"], ph["during_fault"], ph["after_fault"]
    assert before["iterations"] == 1 and during["iterations"] == 0
    assert after["iterations"] == 4 and after["from_s"] >= 0.8 + 1.0
    assert before["to_s"] <= 0.8
    # throughput = samples per iteration / mean seconds (tiny-grpo-sync: 8 x 4 samples)
    samples = workload_preset("tiny-grpo-sync").samples
    assert samples == 32
    for p in (before, after):
        assert p["throughput_samples_per_s"] == pytest.approx(samples / p["iteration_s"])
    secs = d["iterations"]
    assert before["iteration_s"] == pytest.approx(secs[0])
    assert after["iteration_s"] == pytest.approx(sum(secs[1:]) / 4)
    code, text, _ = run(capsys, *JOB, "-n", "5", "--faults", faults(tmp_path, scenario))
    assert code == 0
    assert "phases around the first fault (at 0.80 s): before: 1 iteration(s)" in text
    assert "re-plan and restart 1.0 s" in text and "after: 4 iteration(s)" in text


def test_no_fault_no_phases(capsys):
    code, out, _ = run(capsys, *JOB, "-n", "2", "--json")
    assert code == 0 and json.loads(out)["phases"] == {}


@pytest.mark.parametrize("data,fragments", [
    ({"events": [{"at_s": 0, "kind": "link_degraded", "regions": ["us-east-1", "eu-west-1"],
                  "bandwidth_factor": 1e-12}]},
     ["link_degraded us-east-1/eu-west-1 bandwidth_factor 1e-12", "horizon of 1e+09 s"]),
    ({"events": [{"at_s": 0, "kind": "straggler", "device": 0, "slowdown": 1e300}]},
     ["faults.events[0].slowdown", "[1, 1e+06]"]),
    ({"events": [LOST], "replan": {"delay_s": float("inf")}},
     ["faults.replan.delay_s", "inf", "[0, 1e+09]"]),
])
def test_extreme_faults_are_one_line_exit_2(capsys, tmp_path, data, fragments):
    code, out, err = run(capsys, *JOB, "-n", "3", "--faults", faults(tmp_path, data))
    assert out == ""
    assert_user_error(code, err, *fragments, command="simulate")
