"""Valid documents of every file kind (workload, cluster, plan, faults, trace) and a writer, for
the hostile-input regression tests and the fuzz tests (issue 28)."""

from __future__ import annotations

import copy
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from hetrl.plan import Plan
from hetrl.spec.presets import cluster_preset, workload_preset

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WORKLOAD = "tiny-grpo-sync"
CLUSTER = "tiny4-single-region"
PLAN_FILE = EXAMPLES / "plan-tiny-grpo-tiny4.yaml"


def workload_doc() -> dict[str, Any]:
    return workload_preset(WORKLOAD).to_dict()


def moe_workload_doc() -> dict[str, Any]:
    """The tiny workload with a mixture-of-experts model (a dense first layer, shared and
    routed experts) and FP8 rollouts, without sequence parallelism and with the actor's own
    recomputation and a bf16 optimizer, run by OpenRLHF: the MoE, FP8, memory and framework
    fields to mutate."""
    doc = workload_doc()
    doc["sequence_parallel"] = False
    doc["framework"] = "openrlhf"
    doc["task_batching"] = {"actor_training": {"recompute": True}}
    moe = {"experts": 4, "top_k": 2, "expert_ffn": 32, "shared_experts": 1, "shared_ffn": 32,
           "dense_layers": 1, "layer_freq": 1, "router": "softmax"}
    for model in doc["models"].values():
        model["moe"] = dict(moe)
    doc["gen_precision"] = "fp8"
    doc["optimizer_precision"] = "bf16"
    return doc


def moe_plan_doc() -> dict[str, Any]:
    """The tiny plan with every task at expert parallelism 2 (over its 2 replicas)."""
    doc = plan_doc()
    doc.pop("made_for", None)
    for p in doc["placements"]:
        if p["dp"] % 2 == 0:
            p["ep"] = 2
    return doc


def cluster_doc() -> dict[str, Any]:
    return cluster_preset(CLUSTER).to_dict()


def own_gpu_cluster_doc() -> dict[str, Any]:
    """The tiny cluster with a GPU type of its own that gives the driver's memory total."""
    doc = cluster_doc()
    doc["gpu_types"] = [{"name": "my-gpu", "bf16_tflops": 100, "memory_gb": 24,
                         "memory_mib": 23034, "hbm_gbps": 300}]
    doc["nodes"][1]["gpu"] = "my-gpu"
    return doc


def plan_doc() -> dict[str, Any]:
    return yaml.safe_load(PLAN_FILE.read_text())


def faults_doc() -> dict[str, Any]:
    return {"events": [{"at_s": 0.5, "kind": "straggler", "device": 0, "slowdown": 1.5},
                       {"at_s": 1.0, "kind": "device_lost", "device": 3}],
            "replan": {"scheduler": "random", "budget_evals": 5, "seed": 0, "delay_s": 1.0}}


@lru_cache(maxsize=1)
def _trace() -> str:
    from sim import simulate

    workload, cluster = workload_preset(WORKLOAD), cluster_preset(CLUSTER)
    plan = Plan.from_dict(plan_doc())
    return json.dumps(simulate(plan, workload, cluster, 2, 0).trace.to_dict())


def trace_doc() -> dict[str, Any]:
    """A simulated trace of the tiny plan (2 iterations), with its specs in ``meta``."""
    return json.loads(_trace())


def write(path: Path, doc: Any) -> Path:
    """``doc`` into ``path``: text or bytes as they are, else JSON (``.json``; NaN and Infinity
    as Python writes them) or YAML."""
    if isinstance(doc, bytes):
        path.write_bytes(doc)
    elif isinstance(doc, str):
        path.write_text(doc)
    elif path.suffix == ".json":
        path.write_text(json.dumps(doc))
    else:
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def mutated(doc: dict[str, Any], path: tuple, value: Any) -> dict[str, Any]:
    """A deep copy of ``doc`` with the item at ``path`` (keys and indices) set to ``value``."""
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def alias_bomb(key: str, levels: int = 9) -> str:
    """A billion-laughs YAML document whose expansion lands in ``key`` (9**levels strings)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    lines.append(f"{key}: *l{levels - 1}")
    return "\n".join(lines) + "\n"


def deep(levels: int) -> str:
    """A YAML/JSON document nested ``levels`` lists deep under key ``name``."""
    return '{"name": ' + "[" * levels + "]" * levels + "}\n"


def finite_positive(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0
