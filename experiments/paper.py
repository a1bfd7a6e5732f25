"""The HetRL paper's reported numbers (He et al., MLSys 2026), used only as the paper's column in
figures/README.md -- never as inputs. Source: ../shared/docs/paper.md ("Results to reproduce")."""

from __future__ import annotations

#: Throughput ratios (min, max) per scenario: sync HetRL/verl, async HetRL/StreamRL, async HetRL/verl.
FIG3 = {
    "single-region": {"sync_vs_verl": (1.51, 2.05), "async_vs_streamrl": (1.10, 1.31),
                      "async_vs_verl": None},
    "multi-region-hybrid": {"sync_vs_verl": (3.01, 4.99), "async_vs_streamrl": (1.11, 1.27),
                            "async_vs_verl": (4.07, 9.17)},
    "multi-country": {"sync_vs_verl": (1.40, 3.07), "async_vs_streamrl": (1.19, 1.50),
                      "async_vs_verl": (1.71, 4.00)},
    "multi-continent": {"sync_vs_verl": (2.24, 5.46), "async_vs_streamrl": (2.25, 3.72),
                        "async_vs_verl": (4.38, 10.76)},
}
#: Load balancing gains, sync: up to +12% in one region, +18% across regions.
FIG4_MAX_GAIN = {"single-region": 0.12, "cross-region": 0.18}
#: ILP vs SHA-EA: SHA-EA within 1% of the ILP optimum (<= 24 GPUs); ILP proves optima in < 3 min.
FIG6_GAP = 0.01
#: GPU combinations (Qwen-8B, single region): HetRL / verl ranges per job.
FIG10 = {"ppo-sync": (1.72, 4.33), "grpo-sync": (1.77, 3.42), "ppo-async": (1.57, 3.33),
         "grpo-async": (1.57, 3.03)}
#: All 64 GPUs vs 24 A100 only (HetRL): 1.57-2.0x.
FIG10_ALL_VS_A100 = (1.57, 2.0)
