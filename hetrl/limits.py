"""Caps on input sizes, in one place: each bounds the time or memory one input may cost.

A value over a cap is refused with one line naming the field, the value and the cap (exit 2);
docs/reliability.md gives each cap's reason. The caps are far above any job of the paper (64
GPUs, 1024 prompts x 16 responses) and far below what would exhaust a laptop.
"""

from __future__ import annotations

# --- files -------------------------------------------------------------------------------------
#: Largest JSON file read, bytes (a trace of a long real run is a few MB; parsing 16 MiB of JSON
#: takes under a second).
MAX_FILE_BYTES = 16 * 1024 * 1024
#: Largest YAML file read, bytes: YAML is for hand-written specs, and PyYAML builds its objects
#: in Python at ~1-2 s per MB (a 2 MiB YAML file already takes seconds; write big files as JSON).
MAX_YAML_BYTES = 2 * 1024 * 1024
#: Deepest nesting of lists and mappings in a file (the deepest schema, a plan's device grid
#: under placements, is 6 levels deep).
MAX_NESTING = 64

# --- clusters ----------------------------------------------------------------------------------
#: GPUs in one cluster: the topology keeps device x device latency and bandwidth matrices
#: (O(GPUs^2): 4096 GPUs is 134 MB each, built in ~6 s, 1.5 GB peak).
MAX_GPUS = 4096
#: Nodes in one cluster, after ``repeat``: routes are searched from every node (Dijkstra).
MAX_NODES = 512
#: Regions in one cluster, and so at most 64 * 63 / 2 = 2016 ``region_links`` (one per pair).
MAX_REGIONS = 64
MAX_REGION_LINKS = MAX_REGIONS * (MAX_REGIONS - 1) // 2
#: GPUs in one node (a node is an NVLink domain; the largest, GB200 NVL72, has 72).
MAX_GPUS_PER_NODE = 72

# --- workloads ---------------------------------------------------------------------------------
#: Prompts per iteration.
MAX_BATCH_PROMPTS = 65_536
#: Responses sampled per prompt.
MAX_RESPONSES_PER_PROMPT = 1_024
#: Sequences per iteration (batch_prompts x responses_per_prompt): the simulator draws and tracks
#: each one (2**18 sequences: ~20 s and ~0.5 GB for one simulated iteration).
MAX_SAMPLES = 2**18
#: Tokens of one prompt or one response (``max`` of a length distribution): the distribution
#: keeps one probability per length.
MAX_SEQUENCE_TOKENS = 1 << 20
#: Token budget of one micro-batch (``micro_batch_tokens``, ``inference_micro_batch_tokens``).
MAX_BATCH_TOKENS = 1 << 32
#: Layers of one model, and any other dimension of its shape (hidden, ffn, heads, vocab...).
MAX_LAYERS = 4_096
MAX_MODEL_DIM = 1 << 22

# --- runs and searches -------------------------------------------------------------------------
#: Iterations of ``simulate -n`` and ``run -n``.
MAX_ITERATIONS = 10_000
#: Sequences one ``simulate`` call may replay in all (iterations x sequences per iteration):
#: simulation time is linear in them (~70 us each; 2**22 sequences: about 5 minutes).
MAX_SIMULATED_SEQUENCES = 2**22
#: Cost-model evaluations of one search (``--budget-evals``, a fault scenario's
#: ``replan.budget_evals``): ~1 ms each, so 1e7 is hours.
MAX_BUDGET_EVALS = 10_000_000
#: Wall-clock budget of one search, seconds (a week).
MAX_BUDGET_S = 7 * 24 * 3600.0
#: Events of one fault scenario (after ``node_lost`` expands to one event per device).
MAX_FAULT_EVENTS = 10_000
