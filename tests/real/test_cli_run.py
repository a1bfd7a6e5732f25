"""``hetrl run`` end to end from the command line, then ``hetrl calibrate`` on its trace, and
its bad-input errors (exit 2, one line, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import assert_user_error, run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLAN = str(EXAMPLES / "plan-tiny-grpo-tiny4.yaml")


def test_run_json_trace_then_calibrate(capsys, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    trace = tmp_path / "run.json"
    code, out, err = run(capsys, "run", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region",
                         "-p", PLAN, "-n", "2", "--trace", str(trace),
                         "--chrome-trace", str(tmp_path / "chrome.json"),
                         "--trace-raw", str(tmp_path / "raw.json"),
                         "--gantt", str(tmp_path / "run.png"), "--per-gpu", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert len(data["iterations"]) == 2 and data["iteration_s"] > 0
    assert set(data["tasks"]) >= {"actor_generation", "reward_inference", "reference_inference",
                                  "actor_training", "weight_sync"}
    assert data["estimate"]["iteration_s"] > 0 and data["estimate_error"] is not None
    assert data["weights_verified"] == 2 * 2
    assert json.loads(trace.read_text())["source"] == "real"
    assert json.loads((tmp_path / "chrome.json").read_text())["traceEvents"]
    # --trace-raw is --trace's format (hetrl's schema), loaded by hetrl calibrate's loader
    from hetrl.calibrate import load_trace

    assert load_trace(tmp_path / "raw.json") == load_trace(trace)
    assert data["trace"] == str(trace)
    # the Gantt chart of the real run: the simulator's picture code, one row per GPU
    import matplotlib.image

    from hetrl.views.gantt import DPI, gantt_size

    width, height = gantt_size(4)
    assert matplotlib.image.imread(str(tmp_path / "run.png")).shape[:2] == (
        round(height * DPI), round(width * DPI))
    params = tmp_path / "params.yaml"
    code, out, err = run(capsys, "calibrate", "--traces", str(trace), "--out", str(params), "--json")
    assert code == 0, err
    fit = json.loads(out)
    assert fit["error_after"] < fit["error_before"]
    code, out, err = run(capsys, "estimate", "-w", "tiny-grpo-sync", "-c", "tiny4-two-region",
                         "-p", PLAN, "--params", str(params), "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_s"] == pytest.approx(fit["runs"][0]["estimate_after_s"])


@pytest.mark.parametrize("argv, fragments", [
    (["-p", str(EXAMPLES / "plan-qwen3-4b-grpo-a100x8.yaml"), "-c", "a100x8",
      "-w", "qwen3-4b-grpo-sync"], ["placements[actor_generation].tp", "tp = 1 only"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "--kill-at", "x"],
     ["--kill-at", "TASK:ITERATION:DEVICE"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "-n", "0"],
     ["iterations", ">= 1"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "--resume"],
     ["resume", "checkpoint directory"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "--kill-at",
      "critic_training:1:2"], ["kill_at", "(task, device) of the plan"]),
    # --kill-at counts iterations from 1, as the progress line and the messages do
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "--kill-at",
      "actor_training:0:2"], ["--kill-at", "ITERATION must be in 1..2", "counted from 1"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "-n", "3", "--kill-at",
      "actor_training:4:2"], ["--kill-at", "ITERATION must be in 1..3"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "--resume",
      "--checkpoint-dir", "/nonexistent-ckpt"], ["resume", "no checkpoint there"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "--per-gpu"],
     ["--per-gpu", "goes with --gantt"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "--gantt", "g.gif"],
     ["--gantt", "not a picture format"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "--engines", "vllm"],
     ["--engines", "KIND=ENGINE"]),
    (["-p", PLAN, "-c", "tiny4-single-region", "-w", "tiny-grpo-sync", "--engines",
      "training=vllm"], ["engines.training", "not an engine for training"]),
])
def test_run_bad_input(capsys, tmp_path, argv, fragments):
    code, _, err = run(capsys, "run", *argv, "--trace", str(tmp_path / "t.json"))
    assert_user_error(code, err, "hetrl run: error:", *fragments)
    assert not (tmp_path / "t.json").exists()


def test_run_cuda_without_a_gpu_says_so(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    code, _, err = run(capsys, "run", "-p", PLAN, "-c", "tiny4-single-region", "-w",
                       "tiny-grpo-sync", "--device", "cuda")
    assert_user_error(code, err, "hetrl run: error: device = 'cuda'", "no CUDA device")
