"""Collectives over links shaped with the kernel's traffic control (experiments/shaped_links.py):
two network namespaces joined by a veth pair, htb on both ends, gloo between a process on each
side. Needs root and ``ip netns`` (skipped otherwise); this kernel has no netem, so the links
have bandwidth and no added delay.

What these tests hold is what does not depend on how busy the machine is: the shaping caps each
transfer at its class's rate, the simulator replays each transfer as the cost model prices it, and
the model is never faster than the link allows. How close TCP comes to the rate (0.89-0.94 of it
on an idle machine, machine-bound at 5 Gbps) and how close the model comes to the measured time
(issue 58's +-15%) are measurements, not invariants: ``experiments/shaped_links.py`` prints them
and docs/validation.md ("Slow links, measured") records them. A CI run under load measured 1.61
of a 1.9 Gbps link (0.85x), which is why no test bounds the achieved rate from below tightly.
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


def test_the_shaping_caps_each_transfer_at_its_rate(measured):
    """htb's burst is a few KB, nothing against 64 MB: no transfer beats its class's rate. The
    lower bound only says the bytes went over the link at all (a quarter of the rate)."""
    for r in measured:
        assert 0.25 <= r["achieved_gbps"] / r["gbps"] <= 1.0, r


def test_the_simulator_replays_each_transfer_as_the_cost_model_prices_it(measured):
    for r in measured:
        assert r["sim_s"] == pytest.approx(r["model_s"], rel=0.01), r


def test_the_cost_model_is_never_faster_than_the_link_allows(measured):
    """The model prices a transfer at its ``link`` efficiency (0.80) of the rate, and the shaping
    caps the measured transfer at the rate, so the model's time is at most 1/0.80 of the
    measured one whatever the machine's load. How far under that it lands is the benchmark's
    figure (issue 58's +-15%), not this test's."""
    for r in measured:
        assert r["model_ratio"] <= 1 / 0.80, r


def test_namespaces_are_gone_afterwards(measured):
    import subprocess

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in sl.NS)
