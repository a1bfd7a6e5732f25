"""One ``hetrl run`` iteration with ``--engines generation=vllm`` on CPU: the two generation
replicas of the tiny plan run vLLM's CPU build, the trainer's weights reach them, verified."""

from __future__ import annotations

import json
from pathlib import Path

from hetrl.spec.presets import tiny_workload
from tests.cli_helpers import run
from tests.real.vllm.conftest import SPEC

PLAN = str(Path(__file__).resolve().parents[3] / "examples" / "plan-tiny-grpo-tiny4.yaml")


def test_one_iteration_with_vllm_generation(capsys, tmp_path):
    data = tiny_workload("grpo", "sync").to_dict()
    shape = {"name": SPEC.name, "layers": 4, "hidden": SPEC.hidden, "ffn": SPEC.ffn,
             "heads": SPEC.heads, "kv_heads": SPEC.kv_heads, "head_dim": SPEC.head_dim,
             "vocab": SPEC.vocab, "tied_embeddings": False}
    data["models"] = {role: shape for role in data["models"]}  # 4 layers: the plan's stages
    workload = tmp_path / "tiny-grpo-hd32.json"
    workload.write_text(json.dumps(data))
    code, out, err = run(capsys, "run", "-w", str(workload), "-c", "tiny4-single-region",
                         "-p", PLAN, "--allow-mismatch", "-n", "1", "--engines", "generation=vllm",
                         "--json")
    assert code == 0, err
    result = json.loads(out)

    assert len(result["iterations"]) == 1 and result["iteration_s"] > 0
    assert result["weights_verified"] == 2  # both vLLM replicas hold the trained weights
