"""Shared fixtures: presets are built once per session (specs are frozen, so sharing is safe)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.presets import cluster_preset, workload_preset
from hetrl.spec.workload import WorkloadSpec

# Property tests: no per-example deadline (first calls warm caches); a CI profile that is
# reproducible run to run. Select with HYPOTHESIS_PROFILE=ci (the default) or dev.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=200)
# The fuzz tests (tests/test_fuzz.py, marker ``fuzz``) run a few examples per loader under "ci"
# (a few seconds in all) and 10,000 per loader under "long":
#   pytest -m fuzz --hypothesis-profile long
settings.register_profile("long", deadline=None, max_examples=10_000, derandomize=False,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def paper_clusters() -> dict[str, ClusterSpec]:
    """The four paper64 scenarios by short name."""
    return {s: cluster_preset(f"paper64-{s}") for s in
            ("single-region", "multi-region-hybrid", "multi-country", "multi-continent")}


@pytest.fixture(scope="session")
def ppo8b() -> WorkloadSpec:
    return workload_preset("qwen3-8b-ppo-sync")


@pytest.fixture(scope="session")
def grpo4b() -> WorkloadSpec:
    return workload_preset("qwen3-4b-grpo-sync")


@pytest.fixture(scope="session")
def a100x8() -> ClusterSpec:
    return cluster_preset("a100x8")
