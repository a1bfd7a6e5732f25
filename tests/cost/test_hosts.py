"""The cost model's mixins declare what they read of their host (a Protocol per mixin module),
and CostModel provides it: a mixin reading a host attribute it does not declare fails here."""

from __future__ import annotations

import inspect
import re

import pytest

from hetrl.cost import (
    model_forward,
    model_generation,
    model_memory,
    model_transfers,
    neighbourhood,
)
from hetrl.cost.model import CostModel

MIXINS = [
    (model_generation.GenerationTerms, model_generation.GenerationHost),
    (model_forward.ForwardTerms, model_forward.ForwardHost),
    (model_transfers.TransferTerms, model_transfers.TransferHost),
    (model_memory.MemoryTerms, model_memory.MemoryHost),
]


def _members(protocol: type) -> set[str]:
    return set(protocol.__annotations__) | {
        name for name, value in vars(protocol).items() if inspect.isfunction(value)}


@pytest.mark.parametrize(("mixin", "host"), MIXINS, ids=lambda x: x.__name__)
def test_a_mixin_reads_only_what_its_host_protocol_declares(mixin, host):
    own = {name for name in vars(mixin) if not name.startswith("__")}
    read = set(re.findall(r"self\.([A-Za-z_]\w*)", inspect.getsource(mixin)))
    assert read - own - _members(host) == set()


@pytest.mark.parametrize(("mixin", "host"), MIXINS, ids=lambda x: x.__name__)
def test_the_cost_model_is_every_mixins_host(mixin, host, ppo8b, a100x8):
    model = CostModel(ppo8b, a100x8)
    assert isinstance(model, host)
    missing = {name for name in _members(host) if not hasattr(model, name)}
    assert missing == set()


def test_the_neighbourhood_pricer_reads_only_what_its_host_protocol_declares(ppo8b, a100x8):
    read = set(re.findall(r"(?<![\w.])model\.([A-Za-z_]\w*)", inspect.getsource(neighbourhood)))
    assert read - _members(neighbourhood.NeighbourhoodHost) == set()
    model = CostModel(ppo8b, a100x8)
    assert isinstance(model, neighbourhood.NeighbourhoodHost)
    assert {n for n in _members(neighbourhood.NeighbourhoodHost) if not hasattr(model, n)} == set()
