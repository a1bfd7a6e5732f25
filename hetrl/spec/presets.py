"""Built-in presets: the HetRL paper's 64-GPU testbed in its four network scenarios, smaller
clusters, and the paper's jobs. Every preset is built from the shipped data files.

Scenario conventions (the paper leaves these open; documented in docs/specs.md):
- 64 GPUs = 3 nodes of 8 x A100-80GB + 3 nodes of 8 x L40S + 2 nodes of 8 x L4, in that order.
- single-region: all nodes in us-east-1, one zone.
- multi-region-hybrid: Virginia (us-east-1) holds A100 node 0, L40S nodes 3-4 and both L4 nodes;
  Ohio (us-east-2) holds A100 nodes 1-2 and L40S node 5. Between the regions 10 ms one-way and
  5 Gbps, as the paper states. The two L4 nodes are "edge": a 1 Gbps uplink to Virginia only.
- multi-country: one node in each of the eight European regions, nodes in order over the regions
  in the order of ``aws_regions.csv``.
- multi-continent: one node in each of us-east-1, us-east-2 and six European regions (leaving out
  eu-south-2 and eu-central-2, the regions with the least measured data), nodes in order.
"""

from __future__ import annotations

from collections.abc import Callable

from hetrl.errors import SpecError, did_you_mean, find_name
from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.lengths import LengthDist
from hetrl.spec.model import model_preset
from hetrl.spec.regions import aws_region_links
from hetrl.spec.workload import WorkloadSpec

PAPER_NODE_TYPES = ("A100-80GB",) * 3 + ("L40S",) * 3 + ("L4",) * 2
EUROPE = ("eu-west-3", "eu-north-1", "eu-west-2", "eu-west-1", "eu-south-2", "eu-central-2",
          "eu-central-1", "eu-south-1")
CONTINENTS = ("us-east-1", "us-east-2", "eu-west-3", "eu-north-1", "eu-west-2", "eu-west-1",
              "eu-central-1", "eu-south-1")


def _paper_nodes(regions: tuple[str, ...], edge: frozenset[int] = frozenset(),
                 types: tuple[str, ...] = PAPER_NODE_TYPES) -> tuple[NodeSpec, ...]:
    return tuple(
        NodeSpec(f"n{i}-{gpu}", gpu, 8, regions[i], edge=i in edge) for i, gpu in enumerate(types)
    )


def paper64(scenario: str) -> ClusterSpec:
    """The paper's 64-GPU testbed under one of its four network scenarios."""
    name = f"paper64-{scenario}"
    if scenario == "single-region":
        return ClusterSpec(name, _paper_nodes(("us-east-1",) * 8))
    if scenario == "multi-region-hybrid":
        va, oh = "us-east-1", "us-east-2"
        regions = (va, oh, oh, va, va, oh, va, va)
        return ClusterSpec(name, _paper_nodes(regions, edge=frozenset({6, 7})),
                           region_links=(RegionLink(va, oh, 10.0, 5.0),))
    if scenario == "multi-country":
        return ClusterSpec(name, _paper_nodes(EUROPE), region_links=tuple(aws_region_links(EUROPE)))
    if scenario == "multi-continent":
        return ClusterSpec(name, _paper_nodes(CONTINENTS),
                           region_links=tuple(aws_region_links(CONTINENTS)))
    raise SpecError("scenario", scenario, f"unknown; known: {', '.join(SCENARIOS)}")


SCENARIOS = ("single-region", "multi-region-hybrid", "multi-country", "multi-continent")


def _subset(name: str, types: tuple[str, ...]) -> Callable[[], ClusterSpec]:
    return lambda: ClusterSpec(name, _paper_nodes(("us-east-1",) * len(types), types=types))


def _two_region_small(name: str, types: tuple[str, ...]) -> Callable[[], ClusterSpec]:
    """Small heterogeneous clusters for exact (ILP) search: nodes alternate Virginia / Ohio."""
    def build() -> ClusterSpec:
        regions = tuple("us-east-1" if i % 2 == 0 else "us-east-2" for i in range(len(types)))
        nodes = tuple(NodeSpec(f"n{i}-{g}", g, 8, regions[i]) for i, g in enumerate(types))
        return ClusterSpec(name, nodes, region_links=tuple(aws_region_links(("us-east-1", "us-east-2"))))
    return build


CLUSTER_PRESETS: dict[str, tuple[str, Callable[[], ClusterSpec]]] = {
    **{f"paper64-{s}": (f"HetRL testbed, 24 A100 + 24 L40S + 16 L4, {s}",
                        (lambda s=s: paper64(s))) for s in SCENARIOS},
    "paper24-a100-single-region": ("24 A100-80GB in 3 nodes, one region (paper fig. 10)",
                                   _subset("paper24-a100-single-region", ("A100-80GB",) * 3)),
    "paper48-a100-l40s-single-region": (
        "24 A100-80GB + 24 L40S, one region (paper fig. 10)",
        _subset("paper48-a100-l40s-single-region", ("A100-80GB",) * 3 + ("L40S",) * 3)),
    "a100x8": ("one node of 8 A100-80GB", _subset("a100x8", ("A100-80GB",))),
    "hetero8-two-region": ("4 A100 (Virginia) + 4 L40S (Ohio), nodes of 4: a small ILP instance",
                           lambda: ClusterSpec("hetero8-two-region", (
                               NodeSpec("n0-A100-80GB", "A100-80GB", 4, "us-east-1"),
                               NodeSpec("n1-L40S", "L40S", 4, "us-east-2")),
                               region_links=tuple(aws_region_links(("us-east-1", "us-east-2"))))),
    "hetero16-two-region": ("8 A100 (Virginia) + 8 L40S (Ohio): a small ILP instance",
                            _two_region_small("hetero16-two-region", ("A100-80GB", "L40S"))),
    "hetero24-two-region": ("8 A100 + 8 L4 (Virginia) + 8 L40S (Ohio): a small ILP instance",
                            _two_region_small("hetero24-two-region", ("A100-80GB", "L40S", "L4"))),
}

#: Lengths of the paper's jobs: max 1024 tokens for prompts and responses (paper, Sec. 5). The
#: means are our assumption (GSM8K prompts with a chat template are a few hundred tokens; reasoning
#: responses fill about half the budget on average), stated in docs/specs.md.
PAPER_PROMPT_LENGTH = LengthDist(mean=256, max=1024, min=16, std=128)
PAPER_RESPONSE_LENGTH = LengthDist(mean=512, max=1024, min=16, std=256)


def paper_workload(size: str, algorithm: str, mode: str) -> WorkloadSpec:
    """One of the paper's jobs: Qwen3-{size}, batch 384 prompts x 8 responses, lengths <= 1024
    (``size`` "30b-a3b": the mixture-of-experts Qwen3-30B-A3B on the same settings)."""
    model = model_preset(f"Qwen3-{size.upper()}")
    roles = ("actor", "reference", "reward", "critic") if algorithm == "ppo" else (
        "actor", "reference", "reward")
    return WorkloadSpec(
        name=f"qwen3-{size}-{algorithm}-{mode}",
        algorithm=algorithm,
        mode=mode,
        staleness=1 if mode == "async" else 0,
        models=tuple((r, model) for r in roles),
        batch_prompts=384,
        responses_per_prompt=8,
        prompt_length=PAPER_PROMPT_LENGTH,
        response_length=PAPER_RESPONSE_LENGTH,
    )


WORKLOAD_PRESETS: dict[str, tuple[str, Callable[[], WorkloadSpec]]] = {
    f"qwen3-{size}-{alg}-{mode}": (
        f"Qwen3-{size.upper()} {alg.upper()} {mode}, 384 prompts x 8 responses, <= 1024 tokens",
        (lambda size=size, alg=alg, mode=mode: paper_workload(size, alg, mode)))
    for size in ("4b", "8b", "14b") for alg in ("ppo", "grpo") for mode in ("sync", "async")
}
# the paper's settings with a mixture-of-experts model (every role Qwen3-30B-A3B: 30.5B
# parameters, 3.3B active per token)
WORKLOAD_PRESETS.update({
    f"qwen3-30b-a3b-{alg}-{mode}": (
        f"Qwen3-30B-A3B (MoE, 128 experts, top-8) {alg.upper()} {mode}, 384 prompts x 8 "
        "responses, <= 1024 tokens",
        (lambda alg=alg, mode=mode: paper_workload("30b-a3b", alg, mode)))
    for alg in ("ppo", "grpo") for mode in ("sync", "async")
})


#: Lengths of the tiny jobs of the real backend's CPU path: prompts are the shipped GSM8K-style
#: problems under the byte tokenizer (one token per byte plus BOS: 78-120 tokens, mean 99.5, std
#: 13.5 over real/data/gsm8k_style_256.jsonl); responses are cut at 16 tokens (a randomly
#: initialised model rarely emits EOS, so nearly all reach it).
TINY_PROMPT_LENGTH = LengthDist(mean=99.5, max=120, min=78, std=13.5)
TINY_RESPONSE_LENGTH = LengthDist(mean=16, max=16, min=16, kind="fixed")


def tiny_workload(algorithm: str, mode: str, model_name: str = "tiny-qwen3",
                  prefix: str = "tiny") -> WorkloadSpec:
    """A job the CPU path of ``real/`` runs in seconds: ``model_name`` (tiny-qwen3, or its
    mixture-of-experts twin tiny-qwen3-moe), 8 prompts x 4 responses."""
    model = model_preset(model_name)
    roles = ("actor", "reference", "reward", "critic") if algorithm == "ppo" else (
        "actor", "reference", "reward")
    return WorkloadSpec(
        name=f"{prefix}-{algorithm}-{mode}", algorithm=algorithm, mode=mode,
        staleness=1 if mode == "async" else 0, models=tuple((r, model) for r in roles),
        batch_prompts=8, responses_per_prompt=4, prompt_length=TINY_PROMPT_LENGTH,
        response_length=TINY_RESPONSE_LENGTH, micro_batch_size=8, inference_micro_batch_size=16)


WORKLOAD_PRESETS.update({
    f"tiny-{alg}-{mode}": (f"tiny-qwen3 {alg.upper()} {mode}, 8 prompts x 4 responses, 16 new "
                           "tokens (the real backend's CPU path)",
                           (lambda alg=alg, mode=mode: tiny_workload(alg, mode)))
    for alg in ("ppo", "grpo") for mode in ("sync", "async")
})
WORKLOAD_PRESETS.update({
    f"tiny-moe-{alg}-{mode}": (
        f"tiny-qwen3-moe (4 experts, top-2) {alg.upper()} {mode}, 8 prompts x 4 responses, 16 "
        "new tokens (the real backend's CPU path with expert parallelism)",
        (lambda alg=alg, mode=mode: tiny_workload(alg, mode, "tiny-qwen3-moe", "tiny-moe")))
    for alg in ("ppo", "grpo") for mode in ("sync", "async")
})


def _tiny4(name: str, regions: tuple[str, str]) -> Callable[[], ClusterSpec]:
    """2 A100 + 2 L4 in two nodes, in ``regions``: plans the CPU path runs under emulation."""
    return lambda: ClusterSpec(name, (NodeSpec("n0-A100-80GB", "A100-80GB", 2, regions[0]),
                                      NodeSpec("n1-L4", "L4", 2, regions[1])),
                               region_links=tuple(aws_region_links(tuple(sorted(set(regions))))))


CLUSTER_PRESETS.update({
    "tiny4-single-region": ("2 A100-80GB + 2 L4 in us-east-1 (the real backend's CPU tests)",
                            _tiny4("tiny4-single-region", ("us-east-1", "us-east-1"))),
    "tiny4-two-region": ("2 A100-80GB (us-east-1) + 2 L4 (eu-west-1), the same devices as "
                         "tiny4-single-region across the Atlantic",
                         _tiny4("tiny4-two-region", ("us-east-1", "eu-west-1"))),
})


def preset_name(name: object, presets: dict[str, object]) -> str | None:
    """The preset ``name`` names, matched as typed or else ignoring case (None: no preset)."""
    return find_name(name, presets)


def cluster_preset(name: str) -> ClusterSpec:
    key = preset_name(name, CLUSTER_PRESETS)
    if key is None:
        raise SpecError("cluster", name, f"unknown preset; known: {', '.join(CLUSTER_PRESETS)}"
                                         f"{did_you_mean(name, CLUSTER_PRESETS)}")
    return CLUSTER_PRESETS[key][1]()


def workload_preset(name: str) -> WorkloadSpec:
    key = preset_name(name, WORKLOAD_PRESETS)
    if key is None:
        raise SpecError("workload", name, f"unknown preset; known: {', '.join(WORKLOAD_PRESETS)}"
                                          f"{did_you_mean(name, WORKLOAD_PRESETS)}")
    return WORKLOAD_PRESETS[key][1]()
