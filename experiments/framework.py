"""The figure registry, cells, the result cache and the runners (Ray or local processes).

A figure declares its sweep as cells (plain dicts: workload, cluster, scheduler, seed, budgets,
...), computes each cell into rows (dicts), and plots from the table alone. Each cell's rows are
cached under ``experiments/results/cache/<figure>/<key>.json`` where the key hashes the cell's
full configuration and the code version (a hash of the sources), so an interrupted run resumes
where it stopped and a changed cell or changed code recomputes. Writes are atomic. Beside the rows
the file records where the cell ran (``ran_on``: host, pid, Ray node), which no table holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from hetrl.io import write_text_atomic

ROOT = Path(__file__).resolve().parent.parent
#: Where tables and the cell cache go, and where figures are drawn (overridable for tests).
RESULTS = Path(os.environ.get("HETRL_RESULTS_DIR", ROOT / "experiments" / "results"))
FIGURES = Path(os.environ.get("HETRL_FIGURES_DIR", ROOT / "figures"))
MODES = ("quick", "default", "full")


@dataclass(frozen=True)
class Config:
    """How big a run is: ``mode`` picks budgets and subsets; ``seeds`` repeats cells."""

    mode: str = "default"
    seeds: int = 1

    def pick(self, quick: Any, default: Any, full: Any) -> Any:
        return {"quick": quick, "default": default, "full": full}[self.mode]


class Figure(ABC):
    """One figure: its sweep, how to compute a cell, and how to plot the table."""

    name: ClassVar[str]
    title: ClassVar[str]

    @abstractmethod
    def cells(self, config: Config) -> list[dict[str, Any]]:
        """The sweep: one dict per cell (JSON-serialisable, fully describing the cell)."""

    @abstractmethod
    def compute(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        """Rows of the results table for one cell (runs in a worker)."""

    @abstractmethod
    def plot(self, table: pd.DataFrame, path: Path) -> None:
        """Draw the figure from the table alone."""

    def summary(self, table: pd.DataFrame) -> list[dict[str, str]]:
        """Rows for figures/README.md: {what, ours, paper, reading}."""
        return []

    def budget(self, config: Config) -> str:
        """The search budget in ``config``'s mode, in words (figures/README.md's run sizes)."""
        return describe_budget(self.cells(config))


def describe_budget(cells: list[dict[str, Any]]) -> str:
    """A sweep's search budgets from its cells' ``evaluations`` (cost-model evaluations per
    search) and ``seconds`` (wall-clock per search), by scheduler where they differ, with the
    seeds and cells: ``1,000 evaluations per search; 3 seeds; 120 cells``."""
    budgets: dict[str, list[str]] = {}
    for cell in cells:
        parts = []
        if cell.get("evaluations") is not None:
            parts.append(f"{cell['evaluations']:,} evaluations")
        if cell.get("seconds") is not None:
            parts.append(f"{cell['seconds']:g} s wall-clock")
        who = cell.get("scheduler") or cell.get("system") or cell.get("source")
        names = budgets.setdefault(" or ".join(parts) or "no search budget", [])
        if who and who not in names:
            names.append(who)
    if len(budgets) == 1:
        text = f"{next(iter(budgets))} per search"
    else:
        text = "; ".join(f"{b} per search ({', '.join(names)})" for b, names in budgets.items())
    seeds = len({cell.get("seed", 0) for cell in cells})
    return f"{text}; {seeds} seed{'s' * (seeds != 1)}; {len(cells)} cells"


REGISTRY: dict[str, Figure] = {}


def register(cls: type[Figure]) -> type[Figure]:
    if cls.name in REGISTRY:
        raise RuntimeError(f"duplicate figure {cls.name!r}")
    REGISTRY[cls.name] = cls()
    return cls


def load_figures() -> dict[str, Figure]:
    import importlib

    for module in ("fig3", "fig4", "fig5", "fig6", "fig7", "fig10", "scaling", "faults", "cost",
                   "moe"):
        importlib.import_module(f"experiments.figures.{module}")
    return REGISTRY


def code_version() -> str:
    """A hash of the sources that compute results (hetrl, sim, experiments)."""
    h = hashlib.sha256()
    for pkg in ("hetrl", "sim", "experiments"):
        for path in sorted((ROOT / pkg).rglob("*")):
            if path.suffix in (".py", ".csv", ".yaml") and "results" not in path.parts:
                h.update(str(path.relative_to(ROOT)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cell_key(figure: str, cell: dict[str, Any], version: str) -> str:
    text = json.dumps({"figure": figure, "cell": cell, "version": version}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_path(figure: str, key: str) -> Path:
    return RESULTS / "cache" / figure / f"{key}.json"


class CellError(Exception):
    """A cell failed; its traceback is the message (the run goes on, the cell is not cached)."""


def compute_cell(figure: str, cell: dict[str, Any]) -> list[dict[str, Any]] | CellError:
    """Compute one cell in this process (what a Ray task or a pool worker runs). A failure is
    returned, not raised, so one bad cell does not stop the sweep."""
    import traceback

    fig = load_figures()[figure]
    start = time.perf_counter()
    try:
        rows = fig.compute(cell)
    except Exception:  # noqa: BLE001 -- reported by the driver with the cell that failed
        return CellError(traceback.format_exc())
    took = time.perf_counter() - start
    return [{**row, "cell_seconds": took} for row in rows]


def where() -> dict[str, Any]:
    """Where this process computes: its host and pid, and inside a Ray worker the Ray node's
    id (which tells two nodes on one host apart). Kept beside a cell's rows in its cached file
    (``ran_on``), never in the rows: the tables and the cache keys do not depend on it."""
    import socket
    import sys

    out: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    ray = sys.modules.get("ray")  # only a Ray worker has it imported; never import it here
    if ray is not None and ray.is_initialized():
        out["ray_node"] = ray.get_runtime_context().get_node_id()
    return out


def run_cell(figure: str, cell: dict[str, Any]) -> tuple[list[dict[str, Any]] | CellError, dict[str, Any]]:
    """:func:`compute_cell` and :func:`where` it ran: what every runner's workers run."""
    return compute_cell(figure, cell), where()


@dataclass
class Job:
    figure: str
    cell: dict[str, Any]
    key: str

    @property
    def path(self) -> Path:
        return cache_path(self.figure, self.key)


def store(job: Job, rows: list[dict[str, Any]], ran_on: dict[str, Any] | None = None) -> None:
    """Cache a cell's rows with its key (which hashes the cell and the code version) and
    figure, so that :func:`cache_problem` can tell a file that belongs here from one that does
    not (written atomically: a kill leaves the old file or the new one). ``ran_on`` (from
    :func:`where`: host, pid, Ray node) is kept beside the rows, for the record only."""
    data = {"figure": job.figure, "key": job.key, "cell": job.cell, "rows": rows}
    if ran_on is not None:
        data["ran_on"] = ran_on
    write_text_atomic(job.path, json.dumps(data, default=float))


def remove_stale_temps(folder: Path) -> int:
    """Delete the temporary files an atomic write leaves when its process is killed between
    writing and renaming (``.<name>.<random>.tmp``, hetrl.io.write_text_atomic; never read as a
    cached cell); the number removed. Called by a run before it computes any cell."""
    removed = 0
    for tmp in folder.rglob(".*.tmp") if folder.is_dir() else ():
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def cache_problem(job: Job) -> str | None:
    """Why ``job``'s cached file cannot be used (None: it can): missing, unreadable, not JSON
    (truncated or empty), not this cell's (another figure, key or cell), or rows that are not
    a list of records. A cell with a problem is recomputed, never trusted."""
    try:
        text = job.path.read_text()
    except FileNotFoundError:
        return "missing"
    except (OSError, UnicodeDecodeError) as exc:
        return f"unreadable ({getattr(exc, 'strerror', None) or exc})"
    if not text.strip():
        return "empty"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at character {exc.pos}: truncated?)"
    if not isinstance(data, dict):
        return "not a cached cell (no JSON object)"
    for field, want in (("figure", job.figure), ("key", job.key), ("cell", job.cell)):
        if data.get(field) != want:
            return f"another {field} than this cell's (stale or foreign file)"
    rows = data.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "its rows are not a list of records"
    return None


def load(job: Job) -> list[dict[str, Any]]:
    return json.loads(job.path.read_text())["rows"]


class Runner(ABC):
    @abstractmethod
    def run(self, jobs: list[Job],
            done: Callable[[Job, list[dict[str, Any]] | CellError, dict[str, Any]], None]) -> None:
        """Compute every job, calling ``done(job, rows, ran_on)`` as each finishes (in any
        order): ``rows`` (a CellError if the cell failed) and where it ran (:func:`where`)."""

    def close(self) -> None:  # noqa: B027 -- most runners hold nothing to release
        """Release workers (default: nothing to release)."""


class InlineRunner(Runner):
    def run(self, jobs, done):
        for job in jobs:
            done(job, *run_cell(job.figure, job.cell))


def die_with_parent(parent: int) -> None:
    """Make this process (a pool worker) end when ``parent`` does, even by SIGKILL: on Linux the
    kernel sends SIGKILL when the parent dies (prctl PR_SET_PDEATHSIG); elsewhere a daemon
    thread checks every second whether the process was re-parented. Then, if the parent is
    already gone (it died before this ran), exit now."""
    import signal
    import sys
    import threading

    armed = False
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            armed = False
    if not armed:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


class PoolRunner(Runner):
    """Local processes: the fallback when Ray is not installed. Workers die with the driver
    (:func:`die_with_parent`): a killed run leaves no process behind."""

    def __init__(self, workers: int):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        self.pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                        initializer=die_with_parent, initargs=(os.getpid(),))

    def run(self, jobs, done):
        from concurrent.futures import as_completed

        futures = {self.pool.submit(run_cell, j.figure, j.cell): j for j in jobs}
        for fut in as_completed(futures):
            done(futures[fut], *fut.result())

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


class RayRunner(Runner):
    """Every cell a Ray task: a local Ray instance by default, or a cluster at ``address``.
    Cells are spread over the nodes (``SPREAD``: a node runs as many at a time as it has
    CPUs), and each worker imports this checkout (``PYTHONPATH``), so on a cluster every node
    holds it at the same path, in the same Python environment, as the driver's."""

    def __init__(self, workers: int, address: str | None):
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        self.address = address
        if not ray.is_initialized():
            if address:
                # a node's own PYTHONPATH (${...}: expanded on the node) stays after this checkout
                env = {"PYTHONPATH": f"{ROOT}{os.pathsep}${{PYTHONPATH}}", "OMP_NUM_THREADS": "1"}
                try:
                    ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": env})
                except (ConnectionError, TimeoutError, RuntimeError) as exc:
                    from hetrl.errors import OptionError

                    raise OptionError("--address", address, f"cannot attach: "
                                      f"{str(exc).splitlines()[0][:200]}") from None
            else:
                pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
                ray.init(num_cpus=workers, object_store_memory=200 * 1024**2,
                         _temp_dir=f"/tmp/ray-{os.getuid()}", include_dashboard=False,
                         log_to_driver=False,
                         runtime_env={"env_vars": {"PYTHONPATH": pythonpath,
                                                   "OMP_NUM_THREADS": "1"}})
        self.ray = ray
        self.task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(run_cell)

    def describe(self, workers: int) -> str:
        """What the cells run on, for the progress output: a cluster's live nodes and CPUs."""
        if not self.address:
            return f"Ray (local, {workers} CPUs)"
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        cpus = sum(n.get("Resources", {}).get("CPU", 0) for n in nodes)
        return f"Ray cluster at {self.address} ({len(nodes)} nodes, {cpus:g} CPUs)"

    def run(self, jobs, done):
        pending = {self.task.remote(j.figure, j.cell): j for j in jobs}
        while pending:
            ready, _ = self.ray.wait(list(pending), num_returns=1)
            for ref in ready:
                done(pending.pop(ref), *self.ray.get(ref))


def check_address(address: str) -> None:
    """Raise a HetrlError naming ``--address`` unless its host answers on its port within 5 s
    (``auto`` and ``local`` are Ray's own names and pass). Checked before ``ray.init``, which
    would otherwise retry for minutes or start a local instance."""
    import socket

    from hetrl.errors import OptionError

    if address in ("auto", "local"):
        return
    rest = address.split("://", 1)[-1]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise OptionError("--address", address, "must be HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5.0):
            pass
    except OSError as exc:
        raise OptionError("--address", address, f"no Ray cluster answers there "
                          f"({exc.strerror or exc}); start it or leave --address out") from None


def make_runner(workers: int, address: str | None, local: bool) -> tuple[Runner, str]:
    """The runner for ``workers`` cells at a time: Ray (at ``address`` if given), else local
    processes. An ``address`` that cannot be used is an error, never a local run instead."""
    from hetrl.errors import OptionError

    if address and local:
        raise OptionError("--address", address, "goes without --local (cells run on that cluster)")
    if address:
        try:
            import ray  # noqa: F401
        except ModuleNotFoundError:
            raise OptionError("--address", address, "needs Ray: pip install -e '.[sweep]'") from None
        check_address(address)
    if local:
        return (InlineRunner(), "inline") if workers == 1 else (PoolRunner(workers), f"{workers} local processes")
    try:
        import ray  # noqa: F401
    except ModuleNotFoundError:
        print("Ray is not installed: `pip install -e '.[sweep]'` runs every cell as a Ray task. "
              f"Falling back to {workers} local process(es).", flush=True)
        return ((InlineRunner(), "inline") if workers == 1 else (PoolRunner(workers), f"{workers} local processes"))
    runner = RayRunner(workers, address)
    return runner, runner.describe(workers)


def tables(figures: Iterable[Figure], jobs_by_figure: dict[str, list[Job]]) -> dict[str, pd.DataFrame]:
    """Each figure's table from its cells' cached rows (a cell whose cache has a problem is
    left out: it failed, or was damaged after this run computed it)."""
    out = {}
    for fig in figures:
        rows = []
        for job in jobs_by_figure[fig.name]:
            if cache_problem(job) is None:
                rows.extend(load(job))
        out[fig.name] = pd.DataFrame(rows)
    return out
