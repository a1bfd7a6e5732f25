"""Full garbage collections are held back while a search runs, and restored after."""

from __future__ import annotations

import gc
import threading

import pytest

from hetrl.plan import colocated_plan
from hetrl.search import Budget
from hetrl.search.base import Scheduler
from hetrl.search.collector import NEVER, full_collections_held


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_held_inside_and_restored_after(thresholds):
    with full_collections_held():
        assert gc.get_threshold() == (700, 10, NEVER)  # young collections go on
        with full_collections_held():
            assert gc.get_threshold() == (700, 10, NEVER)
        assert gc.get_threshold() == (700, 10, NEVER)  # the outer block is still open
    assert gc.get_threshold() == (700, 10, 10)


def test_overlapping_blocks_in_threads_restore_once_all_have_closed(thresholds):
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with full_collections_held():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with full_collections_held():
            second_in.set()
            first_out.wait(5)
            seen["after the first closed"] = gc.get_threshold()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["after the first closed"] == (700, 10, NEVER)
    assert gc.get_threshold() == (700, 10, 10)


def test_restored_after_an_exception(thresholds):
    with pytest.raises(RuntimeError), full_collections_held():
        raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10)


def test_explicit_collections_still_free_cycles(thresholds):
    class Node:
        pass

    with full_collections_held():
        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b
        assert gc.collect(0) >= 2


class _Probe(Scheduler):
    name = "probe"

    def run(self, ev):
        self.seen = gc.get_threshold()
        ev.evaluate(colocated_plan(ev.workload, ev.cluster, tp=4))
        return None


def test_search_runs_with_full_collections_held(thresholds, small_workload, small_cluster):
    probe = _Probe()
    probe.search(small_workload, small_cluster, Budget(evaluations=1, seed=0))
    assert probe.seen == (700, 10, NEVER)
    assert gc.get_threshold() == (700, 10, 10)
