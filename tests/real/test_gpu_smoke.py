"""real.gpu_smoke on a machine without CUDA: its CLI, its refusal, and its run logic on CPU."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hetrl.calibrate import CalibrationRun
from hetrl.plan import colocated_plan
from hetrl.spec.cluster import homogeneous
from hetrl.spec.presets import workload_preset
from real import gpu_smoke

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "real.gpu_smoke", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_help_works():
    proc = _run("--help")
    assert proc.returncode == 0 and "--out" in proc.stdout and "--iterations" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_exits_2_with_one_line(tmp_path):
    proc = _run("--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_catalog_gpu_maps_device_names():
    assert gpu_smoke.catalog_gpu("NVIDIA H200", 150.0) == "H200"
    assert gpu_smoke.catalog_gpu("NVIDIA H100 80GB HBM3", 85.0) == "H100"
    assert gpu_smoke.catalog_gpu("NVIDIA A100-SXM4-40GB", 42.5) == "A100-40GB"
    assert gpu_smoke.catalog_gpu("NVIDIA A100-SXM4-80GB", 85.1) == "A100-80GB"
    with pytest.raises(gpu_smoke.SmokeError, match="not in hetrl's catalog"):
        gpu_smoke.catalog_gpu("Quantum Widget 9000", 16.0)


@pytest.mark.parametrize("workload_name", ["tiny-grpo-sync", "tiny-ppo-sync"])
def test_smoke_loop_on_cpu_writes_a_calibratable_trace(workload_name, one_thread):
    """The smoke run's loop on CPU (what the GPU machine runs on cuda), two short iterations."""
    from dataclasses import replace

    from hetrl.spec.lengths import LengthDist

    workload = workload_preset(workload_name)
    workload = replace(workload, batch_prompts=2, response_length=LengthDist(mean=4, max=4, min=4,
                                                                              kind="fixed"))
    cluster = homogeneous("H200", nodes=1, gpus_per_node=1, name="1xH200-local")
    trace, run, last = gpu_smoke.run_torch(workload, cluster, 2, seed=0, device="cpu")
    assert run.plan == colocated_plan(workload, cluster)
    assert len(trace.iterations) == 2 and trace.source == "real"
    measured = trace.task_seconds()
    assert set(workload.task_names) | {"weight_sync"} <= set(measured)
    assert all(v > 0 for v in measured.values())
    result = gpu_smoke.compare(trace, workload, cluster, run.plan)
    for task in workload.task_names:
        row = result["tasks"][task]
        assert row["estimated_s"] > 0 and math.isfinite(row["measured_over_estimated"])
    loaded = CalibrationRun.from_trace(type(trace).from_dict(json.loads(json.dumps(trace.to_dict()))))
    assert loaded.plan == run.plan and loaded.workload == workload
    assert last["batch"].size == workload.samples


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                    reason="megatron-core not installed (pip install megatron-core)")
def test_megatron_step_on_cpu(one_thread):
    from dataclasses import replace

    from hetrl.spec.lengths import LengthDist

    workload = replace(workload_preset("tiny-grpo-sync"), batch_prompts=2,
                       response_length=LengthDist(mean=4, max=4, min=4, kind="fixed"))
    cluster = homogeneous("H200", nodes=1, gpus_per_node=1)
    _, run, last = gpu_smoke.run_torch(workload, cluster, 1, seed=0, device="cpu")
    out = gpu_smoke.megatron_step(run, last, seed=0, device="cpu")
    assert out["same_initial_weights"] and out["exported_to_torch_rollout"]
    assert out["max_abs_loss_diff"] < 1e-4
