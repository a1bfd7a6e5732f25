"""``hetrl profile``: quick measurements are positive and finite, and the cluster file they make
loads and estimates."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from hetrl.cli import main
from hetrl.cost.model import CostModel
from hetrl.errors import SpecError
from hetrl.io import load_cluster
from hetrl.plan import colocated_plan
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.presets import workload_preset
from real.profile import ProfileResult, cluster_dict, profile_devices

FIGURES = ("matmul_tflops", "hbm_gbps", "link_latency_s", "link_gbps", "memory_gb")


def _hand_result() -> ProfileResult:
    return ProfileResult(matmul_tflops=0.05, hbm_gbps=12.0, link_latency_s=4e-4, link_gbps=1.5,
                         memory_gb=8.0, hostname="box", date="2025-01-02")


def test_cluster_dict_is_a_loadable_cluster():
    data = cluster_dict(_hand_result(), 4, "p4", gpu_name="cpu-box")
    (gpu,) = data["gpu_types"]
    assert gpu == {"name": "cpu-box", "bf16_tflops": 0.05, "memory_gb": 8.0, "hbm_gbps": 12.0,
                   "intra_link": "pcie", "intra_link_gbps": 1.5, "node_nic_gbps": 12.0,
                   "source": gpu["source"]}
    assert gpu["source"].startswith("hetrl profile on box 2025-01-02")
    assert data["nodes"] == [{"name": "local", "gpu": "cpu-box", "count": 4, "region": "local"}]
    cluster = ClusterSpec.from_dict(data)
    assert cluster.num_devices == 4
    assert cluster.devices[0].gpu.flops == pytest.approx(0.05e12)
    assert cluster.devices[0].gpu.hbm_bytes_per_s == pytest.approx(12e9)


def test_profile_rejects_bad_input():
    with pytest.raises(SpecError, match="devices"):
        profile_devices(0, quick=True)
    with pytest.raises(SpecError, match="device"):
        profile_devices(2, device="tpu", quick=True)


def test_profile_cli_quick_writes_a_cluster_that_estimates(tmp_path, capsys):
    out = tmp_path / "cluster.yaml"
    code = main(["profile", "--devices", "2", "--quick", "--gpu-name", "cpu-test", "--out", str(out),
                 "--json"])
    stdout, _ = capsys.readouterr()
    assert code == 0
    figures = json.loads(stdout)
    assert set(FIGURES) | {"out"} <= set(figures)
    for key in FIGURES:
        assert math.isfinite(figures[key]) and figures[key] > 0, key
    assert figures["out"] == str(out)
    # the CPU path: well under a TFLOPS, a latency between 1 us and 1 s
    assert figures["matmul_tflops"] < 100 and 1e-6 < figures["link_latency_s"] < 1
    raw = yaml.safe_load(out.read_text())
    assert raw["gpu_types"][0]["name"] == "cpu-test" and raw["nodes"][0]["count"] == 2
    assert raw["gpu_types"][0]["bf16_tflops"] == pytest.approx(figures["matmul_tflops"], rel=1e-3)
    cluster = load_cluster(out)
    workload = workload_preset("tiny-grpo-sync")
    est = CostModel(workload, cluster).estimate(colocated_plan(workload, cluster))
    assert math.isfinite(est.iteration_s) and est.iteration_s > 0


def test_profile_cli_bad_devices_is_one_line(tmp_path, capsys):
    code = main(["profile", "--devices", "0", "--out", str(tmp_path / "c.yaml")])
    _, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "devices" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "c.yaml").exists()
