"""Shared fixtures for the torch backend: a very small model and one torch thread."""

from __future__ import annotations

import pytest
import torch

from real.model import TinyModelSpec


@pytest.fixture
def one_thread():
    """The models are tiny: one torch thread beats two contending ones."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def small() -> TinyModelSpec:
    """Two layers, hidden 32: smaller than the default tiny spec, same structure."""
    return TinyModelSpec(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, ffn=64)


@pytest.fixture(scope="session")
def small_moe() -> TinyModelSpec:
    """``small`` with every MLP made 4 experts of width 16, top-2 (a Qwen3-MoE)."""
    return TinyModelSpec(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, ffn=64,
                         experts=4, top_k=2, expert_ffn=16, name="small-moe")
