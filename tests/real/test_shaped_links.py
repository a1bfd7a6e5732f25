"""Collectives over links shaped with the kernel's traffic control (experiments/shaped_links.py):
two network namespaces joined by a veth pair, htb on both ends, gloo between a process on each
side. Needs root and ``ip netns`` (skipped otherwise); this kernel has no netem, so the links
have bandwidth and no added delay.

What holds: the shaping delivers its class's rate (TCP over htb reaches 0.85-1.0 of it), and the
simulator replays each transfer as the cost model prices it. What does not, yet: the cost model
applies the ``link`` efficiency (0.80, NCCL's bus bandwidth on NVLink and RDMA) to TCP links too,
where TCP over a shaped link achieves 0.92-0.94 of the rate (docs/validation.md, "Slow links,
measured"): its time for 64 MB and more is 1.15-1.18x the measured at 1 Gbps, outside issue 58's
+-15%. The last bound below states that gap.
"""

from __future__ import annotations

import pytest

from experiments import shaped_links as sl

pytestmark = pytest.mark.slow

WHY_NOT = sl.can_shape()
SIZES = (64 * 2**20, 256 * 2**20)


@pytest.fixture(scope="module")
def measured():
    if WHY_NOT:
        pytest.skip(f"cannot shape links here: {WHY_NOT}")
    out = []
    for link in ("edge", "cross-country"):
        out += sl.measure_link(link, sl.LINK_CLASSES[link], SIZES, reps=1)
    return sl.compare(out)


def test_the_shaped_link_delivers_its_rate(measured):
    for r in measured:
        assert 0.85 <= r["achieved_gbps"] / r["gbps"] <= 1.0, r


def test_the_simulator_replays_each_transfer_as_the_cost_model_prices_it(measured):
    for r in measured:
        assert r["sim_s"] == pytest.approx(r["model_s"], rel=0.01), r


def test_the_cost_model_is_conservative_by_its_link_efficiency_and_no_more(measured):
    """Issue 58's target is +-15% for 64 MB and more; the model is within 15% on the fast side
    and at most 1/0.80 on the slow one: the gap is its ``link`` efficiency (0.80) against
    TCP's 0.92-0.94 (docs/validation.md, "Slow links, measured")."""
    for r in measured:
        assert 1 / 1.15 <= r["model_ratio"] <= 1 / 0.80, r


def test_namespaces_are_gone_afterwards(measured):
    import subprocess

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in sl.NS)
