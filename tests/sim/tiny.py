"""Tiny workloads and clusters for the simulator tests, with their numbers worked out by hand.

TINY: a 2-layer decoder, hidden h = 256, ffn 512, 4 heads of 64, 2 KV heads, vocabulary 1000,
untied embeddings. Per layer: attention 2*256*256 + 2*256*128 = 196,608 params, SwiGLU MLP
3*256*512 = 393,216, norms 2*256 = 512 -> 590,336.
Whole model on one stage (actor, LM head): 2*590,336 + 1000*256 (embedding) + 1000*256 (head)
+ 256 (final norm) = 1,692,928 params = 3,385,856 bytes (bf16).
Dense forward FLOPs per token: 2*2*(196,608 + 393,216) + 2*256*1000 (LM head) = 2,871,296.
Attention FLOPs per token per context token: 4 * layers * heads * head_dim = 4*2*4*64 = 2,048.
KV bytes per token: 2 (K, V) * 2 layers * 2 KV heads * 64 * 2 bytes = 1,024.

A100-80GB: 312e12 FLOP/s, 2039e9 B/s HBM, NVLink 300e9 B/s per direction, 1 us per GPU-host
hop. Default efficiencies: infer 0.5, train 0.4, decode_flops 0.4, decode_hbm 0.7, hbm 0.8,
link 0.8.
"""

from __future__ import annotations

from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import ModelShape
from hetrl.spec.workload import WorkloadSpec

TINY = ModelShape("tiny", layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64,
                  vocab=1000)
LAYER_PARAMS = 196_608 + 393_216 + 512  # = 590,336
ACTOR_PARAMS = 2 * LAYER_PARAMS + 2 * 1000 * 256 + 256  # = 1,692,928
ACTOR_WEIGHT_BYTES = 2 * ACTOR_PARAMS  # = 3,385,856
HEAD = 2 * 256 * 1000  # the LM head's FLOPs per token: 512,000
MATMUL = 2 * 2 * (196_608 + 393_216) + HEAD  # = 2,871,296
ATTN = 4 * 2 * 4 * 64  # = 2,048
KV = 2 * 2 * 2 * 64 * 2  # = 1,024

PEAK = 312e12  # A100 FLOP/s
HBM = 2039e9  # A100 B/s
NVLINK = 300e9  # A100 B/s per direction


def tiny_workload(n_prompts: int = 2, responses: int = 2, prompt: int | LengthDist = 16,
                  response: int | LengthDist = 8, algorithm: str = "grpo", mode: str = "sync",
                  **kw) -> WorkloadSpec:
    """A GRPO (or PPO) job of the tiny model; integer lengths are fixed."""
    roles = ("actor", "reference", "reward") + (("critic",) if algorithm == "ppo" else ())
    p = LengthDist.fixed(prompt) if isinstance(prompt, int) else prompt
    r = LengthDist.fixed(response) if isinstance(response, int) else response
    if mode == "async":
        kw.setdefault("staleness", 1)
    return WorkloadSpec(name=f"tiny-{algorithm}-{mode}", algorithm=algorithm, mode=mode,
                        models=tuple((role, TINY) for role in roles), batch_prompts=n_prompts,
                        responses_per_prompt=responses, prompt_length=p, response_length=r, **kw)


def one_node(gpus: int = 1, gpu: str = "A100-80GB") -> ClusterSpec:
    return ClusterSpec(f"tiny-{gpus}x{gpu}", (NodeSpec("n0", gpu, gpus, "r0"),))


def two_nodes(nic_gbps: float = 8.0, gpus: int = 1, region_b: str = "r0",
              link_ms: float = 10.0, link_gbps: float = 0.8) -> ClusterSpec:
    """Two nodes of ``gpus`` A100s each; NICs of ``nic_gbps`` (8 Gbit/s = 1e9 B/s). With
    ``region_b`` != "r0" the second node sits in another region behind a ``link_ms`` one-way,
    ``link_gbps`` per-flow region link."""
    nodes = (NodeSpec("a", "A100-80GB", gpus, "r0", nic_gbps=nic_gbps),
             NodeSpec("b", "A100-80GB", gpus, region_b, nic_gbps=nic_gbps))
    links = (RegionLink("r0", region_b, link_ms, link_gbps),) if region_b != "r0" else ()
    return ClusterSpec("tiny-two-nodes", nodes, links)
