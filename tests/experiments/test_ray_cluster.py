"""experiments/run.py --address on a Ray cluster started apart from the driver, as a user runs
converged sweeps past one machine: a head and a second node come up with ``ray start`` on this
host (loopback address, one CPU and 100 MB of object store each, a temp dir of their own, each
in a process group of its own that the fixture kills at the end, pass or fail), run.py attaches
to it from another folder, and its table must equal a local run's while both nodes ran cells.

The nodes get no PYTHONPATH and the driver runs outside the repository, so the cells import this
checkout only through what RayRunner hands the cluster (its runtime_env), as on real nodes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "experiments" / "run.py"
# The CLI beside the Python that runs the tests (a cluster's nodes and its driver must run the
# same Ray and Python), else the one on PATH.
_BESIDE = Path(sys.executable).with_name("ray")
RAY = str(_BESIDE) if _BESIDE.exists() else shutil.which("ray")
# 32 quick cells of ~0.3 s, deterministic (evaluation budgets, seeded): enough that neither node
# runs them all before the other's worker has started; the rows each figure's table holds (fig7:
# 20 cells, 3 of whose MoE searches find no plan that fits at the quick budget)
FIGURES = {"fig7": 17, "cost": 12}
CELLS = 20 + 12
CLOCKS = ["cell_seconds"]  # wall-clock seconds per cell: the only column that may differ

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(RAY is None, reason="the `ray` command is not installed "
                                           "(pip install -e '.[sweep]')"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes in process group ``pgid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            out.append(int(stat.parent.name))
    return out


def stop(pgids: list[int]) -> None:
    """End every process the nodes started (raylet, GCS, agents, workers: all in the process
    group of their ``ray start``): SIGTERM, then SIGKILL what is left after 2 s. Never
    ``ray stop``, which ends every Ray process of this user on the machine."""
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        for pgid in pgids:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while time.time() < deadline and any(group_members(g) for g in pgids):
            time.sleep(0.1)
        if not any(group_members(g) for g in pgids):
            return


@pytest.fixture
def ray_cluster():
    """A two-node Ray cluster on this host; yields its address (127.0.0.1:PORT)."""
    temp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths are bounded
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    port = free_port()
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--num-gpus", "0",
              "--object-store-memory", str(100 * 1024**2), "--temp-dir", temp,
              "--disable-usage-stats"]
    nodes = [  # every fixed default port chosen free: another cluster on this host may hold it
        ["--head", "--port", str(port), "--include-dashboard", "false",
         "--dashboard-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port())],
        ["--address", f"127.0.0.1:{port}", "--dashboard-agent-listen-port", str(free_port())],
    ]
    pgids: list[int] = []
    try:
        for args in nodes:
            proc = subprocess.Popen([RAY, "start", *args, *common], env=env, cwd=temp,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)  # its own group: all it starts
            pgids.append(proc.pid)
            out, _ = proc.communicate(timeout=120)  # returns once the node is in the GCS
            assert proc.returncode == 0, f"ray start {' '.join(args)} failed:\n{out[-3000:]}"
        yield f"127.0.0.1:{port}"
    finally:
        stop(pgids)
        left = {g: group_members(g) for g in pgids}
        shutil.rmtree(temp, ignore_errors=True)
        assert not any(left.values()), f"Ray processes outlived the cluster: {left}"


def run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HETRL_RESULTS_DIR=str(folder / "results"), HETRL_FIGURES_DIR=str(folder / "figures"),
               RAY_AUTH_MODE="disabled")
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, str(RUN), *args], env=env, cwd=folder,
                          capture_output=True, text=True, timeout=300, check=False)


def ran_on(folder: Path) -> list[dict]:
    """Each cached cell's ``ran_on`` record (where it was computed)."""
    return [json.loads(p.read_text()).get("ran_on", {})
            for p in sorted((folder / "results" / "cache").rglob("*.json"))]


def test_address_runs_on_both_nodes_and_matches_a_local_run(ray_cluster, tmp_path):
    figures = ",".join(FIGURES)
    cluster = run(tmp_path / "cluster", "--quick", "--figures", figures, "--address", ray_cluster)
    assert cluster.returncode == 0, cluster.stdout[-2000:] + cluster.stderr[-3000:]
    # the runner counts the cluster's live nodes (ray.nodes()) when it attaches
    assert f"running on Ray cluster at {ray_cluster} (2 nodes, 2 CPUs)" in cluster.stdout

    local = run(tmp_path / "local", "--quick", "--local", "--workers", "1", "--figures", figures)
    assert local.returncode == 0, local.stderr[-3000:]
    assert "running on inline" in local.stdout
    for name, cells in FIGURES.items():
        tables = [pd.read_csv(tmp_path / where / "results" / "quick" / f"{name}.csv")
                  for where in ("cluster", "local")]
        assert len(tables[0]) == cells, name
        assert not {"ran_on", "ray_node", "host", "pid"} & set(tables[0].columns)
        pd.testing.assert_frame_equal(*(t.drop(columns=CLOCKS) for t in tables), obj=name)

    # every cell says where it ran beside its rows: both nodes ran some of them
    placed = ran_on(tmp_path / "cluster")
    assert len(placed) == CELLS and all("ray_node" in p for p in placed), placed
    per_node = pd.Series([p["ray_node"] for p in placed]).value_counts()
    assert len(per_node) == 2, f"cells ran on {len(per_node)} node(s): {per_node.to_dict()}"
    assert all("ray_node" not in p and p["pid"] for p in ran_on(tmp_path / "local"))
