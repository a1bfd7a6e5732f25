"""Small instances for the scheduler tests (each search takes well under a second or two)."""

from __future__ import annotations

import pytest

from hetrl.spec.cluster import ClusterSpec, NodeSpec, RegionLink
from hetrl.spec.presets import workload_preset
from hetrl.spec.workload import WorkloadSpec


def two_region_cluster(name: str = "a100x4-l40sx4") -> ClusterSpec:
    """4 A100-80GB in Virginia + 4 L40S in Ohio, 10 ms / 5 Gbps between them (8 GPUs)."""
    return ClusterSpec(
        name,
        (NodeSpec("va", "A100-80GB", 4, "us-east-1"), NodeSpec("oh", "L40S", 4, "us-east-2")),
        region_links=(RegionLink("us-east-1", "us-east-2", 10.0, 5.0),),
    )


def small_grpo() -> WorkloadSpec:
    """Qwen3-4B GRPO sync with 64 prompts x 8 responses (the paper's lengths)."""
    return workload_preset("qwen3-4b-grpo-sync").with_(batch_prompts=64)


@pytest.fixture(scope="session")
def small_cluster() -> ClusterSpec:
    return two_region_cluster()


@pytest.fixture(scope="session")
def small_workload() -> WorkloadSpec:
    return small_grpo()
