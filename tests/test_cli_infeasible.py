"""Infeasible, one rule (issue 28): ``estimate`` answers "INFEASIBLE" with exit 3; ``simulate``
and ``run`` refuse a plan that does not fit (exit 2, one line naming the device and its
memory); ``bound`` of a job that no plan can fit exits 2, as ``plan`` does."""

from __future__ import annotations

import pytest

from hetrl.io import save_plan
from hetrl.plan import colocated_plan
from hetrl.spec.presets import cluster_preset, workload_preset
from tests.cli_helpers import assert_user_error, run

JOB = ["-w", "qwen3-8b-ppo-sync", "-c", "a100x8"]


@pytest.fixture(scope="module")
def too_big(tmp_path_factory):
    """Every task on every A100 at tp 1: 166 GB per 80 GB GPU (tests/cost/test_cli_cost.py)."""
    wl, cluster = workload_preset("qwen3-8b-ppo-sync"), cluster_preset("a100x8")
    path = tmp_path_factory.mktemp("infeasible") / "plan.json"
    save_plan(colocated_plan(wl, cluster, tp=1), path)
    return path


def test_estimate_answers_infeasible_with_exit_3(capsys, too_big):
    code, out, err = run(capsys, "estimate", *JOB, "-p", too_big)
    assert code == 3 and err == "" and out.startswith("INFEASIBLE: ")


def test_simulate_refuses_a_plan_that_does_not_fit(capsys, too_big, tmp_path):
    trace = tmp_path / "t.json"
    code, out, err = run(capsys, "simulate", *JOB, "-p", too_big, "--trace-raw", trace)
    assert out == ""
    assert_user_error(code, err, "does not fit a100x8", "device 0 (A100-80GB): needs",
                      "> usable 79.0 GB of 85.9 GB", "more)", command="simulate")
    assert not trace.exists()


def test_run_refuses_a_plan_that_does_not_fit_before_starting_ray(capsys, too_big, tmp_path):
    code, out, err = run(capsys, "run", *JOB, "-p", too_big, "--checkpoint-dir", tmp_path / "ck")
    assert out == ""
    assert_user_error(code, err, "does not fit a100x8", "device 0 (A100-80GB): needs",
                      command="run")
    assert not (tmp_path / "ck").exists()


def test_bound_of_a_job_no_plan_can_fit_exits_2(capsys):
    code, out, err = run(capsys, "bound", "-w", "qwen3-14b-ppo-sync", "-c", "hetero8-two-region")
    assert out == ""
    assert_user_error(code, err, "qwen3-14b-ppo-sync cannot fit on hetero8-two-region",
                      "GB short", command="bound")


def test_bound_of_a_job_that_fits_still_answers(capsys):
    code, out, err = run(capsys, "bound", *JOB)
    assert code == 0 and "no plan can beat" in out, err
