"""``python -m real.gpu_kernels`` on CPU (the CUDA run is a device check): its rows, their
arithmetic and its input errors."""

from __future__ import annotations

import json

import pytest
import torch

from hetrl.spec.model import model_preset
from real import gpu_kernels

TINY = ["--device", "cpu", "--gpu-type", "H200", "--model", "tiny-qwen3", "--budget", "0.05",
        "--batch", "2", "--seq", "32", "--infer-batch", "2", "--decode-batch", "2",
        "--context", "16"]


def test_rows_on_cpu(tmp_path):
    assert gpu_kernels.main(["--out", str(tmp_path), *TINY, "--profile-decode"]) == 0
    assert "aten::" in (tmp_path / "decode_profile.txt").read_text()
    result = json.loads((tmp_path / "kernels.json").read_text())
    assert result["gpu_type"] == "H200" and result["model"] == "tiny-qwen3"
    rows = result["rows"]
    assert set(rows) == {"matmul", "hbm", "train_flops", "infer_flops", "decode_hbm"}
    assert all("error" not in r for r in rows.values()), rows
    train, infer = rows["train_flops"], rows["infer_flops"]
    # the cost model's FLOPs: fwd+bwd of 2 x 32 tokens is 3x the forward of the same tokens
    assert train["flops"] == pytest.approx(3 * infer["flops"])
    for row in (train, infer, rows["decode_hbm"]):
        assert row["measured_s"] > 0
        assert row["cost_model_s"] == pytest.approx(
            row["measured_s"] * row["achieved_of_peak"] / row["default_efficiency"])
    # decode bytes: bf16 weights without the input embedding, plus 2 x 16 tokens of KV
    m = model_preset("tiny-qwen3")
    kv = 2 * m.layers * m.kv_heads * m.head_dim * 2
    assert rows["decode_hbm"]["bytes"] == 2 * (m.params - m.vocab * m.hidden) + 2 * 16 * kv


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "--batch 0: must be >= 1"),
    (["--model", "nope"], "--model"),
    (["--gpu-type", "B300x"], "--gpu-type 'B300x'"),
])
def test_bad_input_exits_2(tmp_path, capsys, argv, message):
    args = ["--out", str(tmp_path), *TINY, *argv]
    assert gpu_kernels.main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "kernels.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_cuda_exits_2(tmp_path, capsys):
    assert gpu_kernels.main(["--out", str(tmp_path), "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
