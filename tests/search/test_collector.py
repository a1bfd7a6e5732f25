"""The cyclic garbage collector is paused while a search runs, and restored after."""

from __future__ import annotations

import gc

import pytest

from hetrl.plan import colocated_plan
from hetrl.search import Budget
from hetrl.search.base import Scheduler
from hetrl.search.collector import cycle_collector_paused


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_and_restored_after(collector_on):
    with cycle_collector_paused():
        assert not gc.isenabled()
        with cycle_collector_paused():  # nested: the inner block must not re-enable it
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restored_after_an_exception(collector_on):
    with pytest.raises(RuntimeError), cycle_collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_left_disabled_if_it_was_disabled(collector_on):
    gc.disable()
    with cycle_collector_paused():
        pass
    assert not gc.isenabled()


class _Probe(Scheduler):
    name = "probe"

    def run(self, ev):
        self.seen = gc.isenabled()
        ev.evaluate(colocated_plan(ev.workload, ev.cluster, tp=4))
        return None


def test_search_runs_with_the_collector_paused(collector_on, small_workload, small_cluster):
    probe = _Probe()
    probe.search(small_workload, small_cluster, Budget(evaluations=1, seed=0))
    assert probe.seen is False
    assert gc.isenabled()
