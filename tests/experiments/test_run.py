"""experiments/run.py end to end: --quick produces every figure, reruns hit the cache, and a
killed-and-restarted run produces the same table as an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "experiments" / "run.py"
FIGURE_NAMES = ("fig3", "fig4", "fig5", "fig6", "fig7", "fig10", "scaling", "faults")


def run(tmp: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HETRL_RESULTS_DIR": str(tmp / "results"),
           "HETRL_FIGURES_DIR": str(tmp / "figures")}
    return subprocess.run([sys.executable, str(RUN), *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quick")
    start = time.perf_counter()
    first = run(tmp, "--quick", "--local", "--workers", "2")
    took = time.perf_counter() - start
    return tmp, first, took


def test_quick_produces_every_figure(quick_run):
    tmp, first, _ = quick_run
    assert first.returncode == 0, first.stderr[-3000:]
    for name in FIGURE_NAMES:  # a quick run writes its own folders (the default's are kept)
        png = tmp / "figures" / "quick" / f"{name}.png"
        assert png.exists() and png.stat().st_size > 1000, name
        table = pd.read_csv(tmp / "results" / "quick" / f"{name}.csv")
        assert len(table) > 0, name
        assert not (tmp / "results" / f"{name}.csv").exists()
        assert not (tmp / "figures" / f"{name}.png").exists()
    readme = (tmp / "figures" / "quick" / "README.md").read_text()
    for name in FIGURE_NAMES:
        assert f"## {name}:" in readme
    assert "| what | ours | paper | reading |" in readme


def test_rerun_hits_the_cache(quick_run):
    tmp, first, took = quick_run
    before = {n: pd.read_csv(tmp / "results" / "quick" / f"{n}.csv") for n in FIGURE_NAMES}
    start = time.perf_counter()
    second = run(tmp, "--quick", "--local", "--workers", "2")
    again = time.perf_counter() - start
    assert second.returncode == 0, second.stderr[-3000:]
    assert "0 to compute" in second.stdout
    assert again < took / 2  # no cell recomputed: plotting only
    for n in FIGURE_NAMES:
        pd.testing.assert_frame_equal(before[n],
                                      pd.read_csv(tmp / "results" / "quick" / f"{n}.csv"))


def test_killed_and_restarted_run_gives_the_same_table(tmp_path):
    figures = "fig4,fig10"  # deterministic cells (evaluation budgets, seeded simulation)
    clean = run(tmp_path / "clean", "--quick", "--local", "--workers", "1", "--figures", figures)
    assert clean.returncode == 0, clean.stderr[-3000:]
    killed_dir = tmp_path / "killed"
    env = {**os.environ, "HETRL_RESULTS_DIR": str(killed_dir / "results"),
           "HETRL_FIGURES_DIR": str(killed_dir / "figures")}
    proc = subprocess.Popen([sys.executable, str(RUN), "--quick", "--local", "--workers", "1",
                             "--figures", figures], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    cache = killed_dir / "results" / "cache"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if len(list(cache.rglob("*.json"))) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(list(cache.rglob("*.json")))
    # no half-written cache file after a kill: every cached cell is whole (written atomically;
    # a kill between the write and the rename can leave only a temporary file, never read)
    for f in cache.rglob("*.json"):
        json.loads(f.read_text())
    again = run(killed_dir, "--quick", "--local", "--workers", "1", "--figures", figures)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not list(cache.rglob("*.tmp")), "the restarted run removed the killed one's temporaries"
    assert f"{done} cached" in again.stdout
    clocks = ["cell_seconds", "search_s"]  # wall-clock seconds: the only columns that may differ
    for name in figures.split(","):
        a = pd.read_csv(tmp_path / "clean" / "results" / "quick" / f"{name}.csv")
        b = pd.read_csv(killed_dir / "results" / "quick" / f"{name}.csv")
        pd.testing.assert_frame_equal(a.drop(columns=clocks, errors="ignore"),
                                      b.drop(columns=clocks, errors="ignore"))


def test_bad_arguments_exit_2(tmp_path):
    bad = run(tmp_path, "--figures", "fig99")
    assert bad.returncode == 2
    assert "unknown figure" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_help():
    out = subprocess.run([sys.executable, str(RUN), "--help"], capture_output=True, text=True,
                         check=True)
    assert "--quick" in out.stdout and "--address" in out.stdout and "--workers" in out.stdout


def test_a_run_removes_the_temporaries_a_killed_run_left(tmp_path):
    """A kill between an atomic write's write and its rename leaves ``.<name>.<random>.tmp``;
    the next run deletes those (never cached cells) and nothing else."""
    from experiments.framework import remove_stale_temps

    fig = tmp_path / "cache" / "fig10"
    fig.mkdir(parents=True)
    (fig / "k1.json").write_text("{}")
    (fig / ".k2.json.x1y2.tmp").write_text('{"half')
    assert remove_stale_temps(tmp_path / "cache") == 1
    assert [p.name for p in fig.iterdir()] == ["k1.json"]
    assert remove_stale_temps(tmp_path / "absent") == 0
