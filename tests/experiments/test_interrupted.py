"""Interrupted work keeps nothing wrong (issue 28): a damaged cached cell is recomputed (and
the progress output says so), pool workers die with a SIGKILLed driver, --quick never touches
the default mode's tables and figures, and bad options or output folders fail before any work
with one line and exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from experiments import framework
from experiments.framework import Job, cache_problem, store

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "experiments" / "run.py"


def run(tmp: Path, *args: str, results: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HETRL_RESULTS_DIR": str(results or tmp / "results"),
           "HETRL_FIGURES_DIR": str(tmp / "figures"), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(RUN), *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("run.py: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- the cell cache ------------------------------------------------------------------------------

@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setattr(framework, "RESULTS", tmp_path)
    return Job("fig4", {"workload": "w", "seed": 0}, "0123456789abcdef0123")


def test_a_stored_cell_is_usable(job):
    assert cache_problem(job) == "missing"
    store(job, [{"x": 1.0}])
    assert cache_problem(job) is None
    assert framework.load(job) == [{"x": 1.0}]


@pytest.mark.parametrize("damage,problem", [
    (lambda text: "", "empty"),
    (lambda text: text[: len(text) // 2], "not JSON"),
    (lambda text: "[1, 2]", "no JSON object"),
    (lambda text: text.replace("0123456789abcdef0123", "ffffffffffffffffffff"), "another key"),
    (lambda text: text.replace('"seed": 0', '"seed": 1'), "another cell"),
    (lambda text: text.replace('"figure": "fig4"', '"figure": "fig3"'), "another figure"),
    (lambda text: text.replace('[{"x": 1.0}]', '{"x": 1.0}'), "not a list of records"),
])
def test_a_damaged_cell_is_detected(job, damage, problem):
    store(job, [{"x": 1.0}])
    job.path.write_text(damage(job.path.read_text()))
    assert problem in cache_problem(job)


def test_a_truncated_and_an_empty_cell_are_recomputed_and_said_so(tmp_path):
    first = run(tmp_path, "--quick", "--local", "--workers", "1", "--figures", "fig4")
    assert first.returncode == 0, first.stderr[-3000:]
    table = pd.read_csv(tmp_path / "results" / "quick" / "fig4.csv")
    cells = sorted((tmp_path / "results" / "cache" / "fig4").glob("*.json"))
    assert len(cells) == 2
    cells[0].write_text(cells[0].read_text()[:40])  # a kill mid-write on a non-atomic copy
    cells[1].write_text("")
    again = run(tmp_path, "--quick", "--local", "--workers", "1", "--figures", "fig4")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 cached, 2 to compute" in again.stdout
    assert again.stdout.count("recomputing fig4 cell") == 2
    assert "is empty" in again.stdout and "is not JSON" in again.stdout
    clocks = ["cell_seconds", "search_s"]
    pd.testing.assert_frame_equal(
        table.drop(columns=clocks, errors="ignore"),
        pd.read_csv(tmp_path / "results" / "quick" / "fig4.csv").drop(columns=clocks,
                                                                      errors="ignore"))
    for cell in cells:
        assert json.loads(cell.read_text())["rows"]


# --- quick mode writes its own folders -----------------------------------------------------------

def test_quick_mode_leaves_the_default_results_untouched(tmp_path):
    default_table = tmp_path / "results" / "fig4.csv"
    default_png = tmp_path / "figures" / "fig4.png"
    default_readme = tmp_path / "figures" / "README.md"
    for path, text in ((default_table, "a,b\n1,2\n"), (default_png, "png"),
                       (default_readme, "# committed\n")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in
              (default_table, default_png, default_readme)}
    proc = run(tmp_path, "--quick", "--local", "--workers", "1", "--figures", "fig4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert before == {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in before}
    assert (tmp_path / "results" / "quick" / "fig4.csv").stat().st_size > 0
    assert (tmp_path / "figures" / "quick" / "fig4.png").stat().st_size > 1000
    assert "`quick` mode" in (tmp_path / "figures" / "quick" / "README.md").read_text()
    # nothing else appeared beside the default files (the cache is shared: its keys differ)
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["cache", "fig4.csv",
                                                                        "quick"]
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["README.md", "fig4.png",
                                                                        "quick"]


# --- options and folders checked before work -----------------------------------------------------

@pytest.mark.parametrize("value,fragment", [("", "must name at least one figure"),
                                            ("fig4,", "empty name"),
                                            ("fig99", "unknown figure(s) ['fig99']")])
def test_bad_figures_option_is_one_line(tmp_path, value, fragment):
    proc = run(tmp_path, "--quick", "--local", "--figures", value)
    one_line_error(proc, "--figures", fragment)
    assert not (tmp_path / "results").exists()


def test_an_unwritable_results_folder_fails_before_any_cell(tmp_path):
    proc = run(tmp_path, "--quick", "--local", "--figures", "fig4", results=Path("/proc/hetrl"))
    one_line_error(proc, "results folder", "/proc/hetrl/quick", "cannot create files in /proc")
    a_file = tmp_path / "file"
    a_file.write_text("")
    proc = run(tmp_path, "--local", "--figures", "fig4", results=a_file)
    one_line_error(proc, "results folder", "is a file, not a directory")


# --- workers die with their parent --------------------------------------------------------------

def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan's zombie waits for its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pool_workers_die_when_the_driver_is_killed():
    script = textwrap.dedent("""
        import time
        from experiments.framework import PoolRunner

        runner = PoolRunner(2)
        futures = [runner.pool.submit(time.sleep, 120) for _ in range(2)]
        while len(runner.pool._processes) < 2:
            time.sleep(0.05)
        time.sleep(1.0)  # the workers have run their initializer
        print(" ".join(str(p) for p in runner.pool._processes), flush=True)
        time.sleep(120)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(p) for p in workers)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.1)
    left = [p for p in workers if _alive(p)]
    for p in left:  # do not leave them behind if the test fails
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} outlived their killed parent"


# --- a Ray address that does not answer ----------------------------------------------------------

@pytest.mark.parametrize("address,fragment", [
    ("ray://127.0.0.1:1", "no Ray cluster answers there (Connection refused)"),
    ("127.0.0.1:1", "no Ray cluster answers there"),
    ("nohost", "must be HOST:PORT or ray://HOST:PORT"),
])
def test_an_unreachable_ray_address_is_one_line_not_a_local_run(tmp_path, address, fragment):
    proc = run(tmp_path, "--quick", "--figures", "fig4", "--address", address)
    one_line_error(proc, "--address", fragment)
    assert "running on" not in proc.stdout and not (tmp_path / "results").exists()


def test_address_and_local_exclude_each_other():
    from hetrl.errors import OptionError

    with pytest.raises(OptionError, match="goes without --local"):
        framework.make_runner(1, "127.0.0.1:1", local=True)
