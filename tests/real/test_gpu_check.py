"""real.gpu_check without a GPU: its refusals, its budget, and its CPU mode (--device cpu
--quick) running the steps the GPU machine runs, at toy sizes."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch

from real import gpu_check

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HAVE_MEGATRON = importlib.util.find_spec("megatron") is not None


@pytest.mark.parametrize("args, message", [
    (["--budget-s", "0"], "--budget-s 0: must be in (0, 3600]"),
    (["--steps", "vllm,nope"], "unknown ['nope']"),
    (["--layers", "0"], "--layers 0"),
])
def test_bad_input_exits_2_with_one_line(args, message, tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "o"), "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_exits_2(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]


def test_a_step_keeps_the_shares_of_the_steps_after_it():
    steps = list(gpu_check.STEPS)
    now = time.time()
    first = gpu_check.step_timeout("vllm", steps, now + 100, 100)
    assert first == pytest.approx(100 * gpu_check.SHARES["vllm"], abs=0.5)
    assert gpu_check.step_timeout("ppo", steps, now + 100, 100) == pytest.approx(100, abs=0.5)


def test_budget_is_honoured(tmp_path, capsys):
    """Under a 2 s budget every step is skipped; with 4 s for the PPO step alone it is killed."""
    assert gpu_check.main(["--out", str(tmp_path / "a"), "--device", "cpu", "--quick",
                           "--budget-s", "2"]) == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert {s: r["status"] for s, r in summary["steps"].items()} == dict.fromkeys(
        gpu_check.STEPS, "skipped")
    assert all(r["reason"].startswith("budget") for r in summary["steps"].values())
    start = time.time()
    assert gpu_check.main(["--out", str(tmp_path / "b"), "--device", "cpu", "--quick",
                           "--steps", "ppo", "--budget-s", "4"]) == 1
    assert time.time() - start < 4 + 3  # the kill and the summary
    rec = json.loads((tmp_path / "b" / "summary.json").read_text())["steps"]["ppo"]
    assert rec["status"] == "failed" and rec["reason"].startswith("timed out after 4 s")
    assert "FAILED ppo" in capsys.readouterr().out


@pytest.mark.slow
def test_cpu_quick_mode_runs_every_step(tmp_path, capsys):
    code = gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--quick",
                           "--budget-s", "300"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    steps = summary["steps"]
    assert code == 0 and summary["passed"], steps
    assert list(steps) == list(gpu_check.STEPS)
    assert steps["vllm"]["status"] == ("passed" if HAVE_VLLM else "skipped")
    if not HAVE_VLLM:
        assert steps["vllm"]["reason"] == "vLLM not installed"
    meg = steps["megatron_tp2"]
    if HAVE_MEGATRON:
        assert meg["status"] == "passed" and meg["mode"] == "cpu-gloo"
        assert all(meg["checks"].values()) and meg["grad_norm_rel_diff"] < 1e-4
    else:
        assert meg["status"] == "skipped" and "megatron-core" in meg["reason"]
    ppo = steps["ppo"]
    assert ppo["status"] == "passed" and ppo["dtype"] == "bfloat16"
    for task in ("actor_generation", "actor_training", "critic_training", "reward_inference"):
        t = ppo["tasks"][task]
        assert t["measured_s"] > 0 and t["estimated_s"] > 0 and t["measured_over_estimated"] > 0
    assert (tmp_path / "ppo-trace.json").exists() and (tmp_path / "ppo.log").exists()
    assert summary["wall_s"] < 300
    out = capsys.readouterr().out
    assert "gpu_check: ok" in out and "actor_training" in out


def test_a_failed_tp_attempt_is_an_error_not_a_hang(tmp_path):
    """An attempt whose ranks fail returns one error line (the step then tries the next way)."""
    from real.gpu_check_tp import attempts, run_attempt

    assert attempts("cuda", 1) == ["cuda-gloo", "cpu-gloo"]
    assert attempts("cuda", 2) == ["cuda-nccl", "cpu-gloo"] and attempts("cpu", 0) == ["cpu-gloo"]
    start = time.time()
    res = run_attempt("no-such-mode", tmp_path, True, 0, 60)
    assert res["error"].startswith("no-such-mode: a rank exited with status [2, ")
    assert time.time() - start < 30
