"""Reproduce the HetRL paper's figures: ``python experiments/run.py``.

Every figure declares its cells; each cell runs as a Ray task (a local Ray instance, or the
cluster at ``--address``), results are cached per cell (resumable; ``--force`` recomputes), then
each figure is drawn from its table into figures/ and figures/README.md puts our numbers beside
the paper's. ``--quick`` is a smoke test (tiny budgets, a subset of cells); ``--full`` uses
paper-scale budgets. Without Ray installed, cells run in local processes.

Only the default mode writes experiments/results/ and figures/ (the committed results);
``--quick`` and ``--full`` write below them, in quick/ and full/. A cached cell that is damaged
(truncated, empty, another cell's) is recomputed, and the progress output says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from experiments.framework import (  # noqa: E402
    FIGURES,
    RESULTS,
    CellError,
    Config,
    Job,
    cache_problem,
    cell_key,
    check_address,
    code_version,
    load_figures,
    make_runner,
    remove_stale_temps,
    store,
    tables,
)
from experiments.report import write_readme  # noqa: E402
from hetrl.io import write_text_atomic  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="experiments/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--figures", help="comma-separated subset, e.g. fig3,fig5 (default: all)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny budgets and few cells (CI smoke test)")
    size.add_argument("--full", action="store_true", help="paper-scale budgets and every cell")
    p.add_argument("--seeds", type=int, default=1, help="seeds per cell where a figure repeats (default 1)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel cells")
    p.add_argument("--address", help="attach to a running Ray cluster: HEAD_IP:6379 from one of "
                   "its nodes, or ray://HEAD_IP:10001 (needs ray[client]); every node holds this "
                   "checkout at the same path (README, 'The figures on a Ray cluster')")
    p.add_argument("--local", action="store_true", help="no Ray: run cells in local processes")
    p.add_argument("--force", action="store_true", help="recompute cached cells")
    p.add_argument("--replot", action="store_true",
                   help="compute nothing: redraw figures and figures/README.md from the saved tables")
    return p.parse_args(argv)


def output_folders(mode: str) -> tuple[Path, Path]:
    """Where a run in ``mode`` writes its tables and figures: the default mode into
    experiments/results/ and figures/ (the committed results), any other mode into a folder
    of its own below them (``quick/``, ``full/``), so that only a default run replaces the
    committed tables and figures. The cell cache is shared: its keys tell cells apart."""
    if mode == "default":
        return RESULTS, FIGURES
    return RESULTS / mode, FIGURES / mode


def figure_names(option: str | None, registry) -> list[str]:
    """The figures ``--figures`` names (all without it); an empty or unknown name is a
    HetrlError naming the option."""
    from hetrl.errors import OptionError

    if option is None:
        return list(registry)
    names = [f.strip() for f in option.split(",")]
    if not any(names):
        raise OptionError("--figures", option, "must name at least one figure; leave the "
                          f"option out for all of them: {', '.join(registry)}")
    if "" in names:
        raise OptionError("--figures", option, "has an empty name (a stray comma?)")
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise OptionError("--figures", option, f"unknown figure(s) {unknown}; known: "
                          f"{', '.join(registry)}")
    return names


def where_text(ran_on: dict) -> str:
    """Where a cell ran, in words: ``host pid 123`` (and ``Ray node 1a2b...`` on Ray)."""
    text = f"{ran_on.get('host', '?')} pid {ran_on.get('pid', '?')}"
    return text + (f", Ray node {ran_on['ray_node'][:12]}" if "ray_node" in ran_on else "")


def main(argv: list[str] | None = None) -> int:
    from hetrl.errors import HetrlError

    try:
        return run(parse(argv))
    except HetrlError as exc:
        print(f"run.py: error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    from hetrl.io import check_output_dir

    registry = load_figures()
    names = figure_names(args.figures, registry)
    if args.seeds < 1 or args.workers < 1:
        print("run.py: error: --seeds and --workers must be >= 1", file=sys.stderr)
        return 2
    config = Config("quick" if args.quick else "full" if args.full else "default", args.seeds)
    if args.address and not args.replot:  # before any work: never a quiet local run instead
        check_address(args.address)
    results_dir, figures_dir = output_folders(config.mode)
    check_output_dir(results_dir, "results folder")  # before any cell is computed
    check_output_dir(figures_dir, "figures folder")
    if args.replot:
        return replot(registry, [registry[n] for n in names], config)
    version = code_version()
    check_output_dir(RESULTS / "cache", "cache folder")
    remove_stale_temps(RESULTS / "cache")  # (a killed run's half-written files, never read)
    figures = [registry[n] for n in names]
    jobs = {f.name: [Job(f.name, c, cell_key(f.name, c, version)) for c in f.cells(config)]
            for f in figures}
    problems = {} if args.force else {j.key: cache_problem(j) for f in figures for j in jobs[f.name]}
    todo = [j for f in figures for j in jobs[f.name] if args.force or problems[j.key]]
    total = sum(len(v) for v in jobs.values())
    damaged = [(j, problems[j.key]) for j in todo if problems.get(j.key, "missing") != "missing"]
    print(f"{len(figures)} figure(s), {total} cells, {total - len(todo)} cached, "
          f"{len(todo)} to compute ({config.mode} mode, code {version})", flush=True)
    for job, problem in damaged:
        print(f"recomputing {job.figure} cell {job.key}: its cached file is {problem} "
              f"({job.path})", flush=True)
    start = time.perf_counter()
    failed: list[tuple[Job, str, dict]] = []
    if todo:
        from tqdm import tqdm

        runner, kind = make_runner(min(args.workers, len(todo)), args.address, args.local)
        print(f"running on {kind}", flush=True)
        bar = tqdm(total=len(todo), unit="cell", desc="cells", dynamic_ncols=True)
        try:
            def done(job: Job, rows, ran_on) -> None:
                if isinstance(rows, CellError):
                    failed.append((job, str(rows), ran_on))
                else:  # written as soon as it finishes: a kill loses no finished cell
                    store(job, rows, ran_on)
                bar.update(1)
                bar.set_postfix_str(job.figure)

            runner.run(todo, done)
        except KeyboardInterrupt:
            print("\ninterrupted: finished cells are cached; run again to resume", file=sys.stderr)
            return 130
        finally:
            bar.close()
            runner.close()
        for job, error, ran_on in failed:
            print(f"\ncell failed ({job.figure} {job.cell}) on {where_text(ran_on)}:\n{error}",
                  file=sys.stderr)
    results = tables(figures, jobs)
    figures_dir.mkdir(parents=True, exist_ok=True)
    for fig in figures:
        table = results[fig.name]
        write_text_atomic(results_dir / f"{fig.name}.csv", table.to_csv(index=False),
                          "results folder")
        fig.plot(table, figures_dir / f"{fig.name}.png")
    write_readme(registry, load_all_tables(registry, config, version), config, figures_dir)
    print(f"done in {time.perf_counter() - start:.1f} s: tables in {results_dir}, figures in "
          f"{figures_dir}", flush=True)
    if todo and failed:
        print(f"{len(failed)} cell(s) failed (see above); their figures miss those cells",
              file=sys.stderr)
        return 1
    return 0


def replot(registry, figures, config) -> int:
    """Figures and README from the tables this mode saved (plots need only the table)."""
    import pandas as pd

    results_dir, figures_dir = output_folders(config.mode)
    tables = {}
    for name in registry:
        path = results_dir / f"{name}.csv"
        if path.exists():
            tables[name] = pd.read_csv(path)
    figures_dir.mkdir(parents=True, exist_ok=True)
    for fig in figures:
        if fig.name in tables:
            fig.plot(tables[fig.name], figures_dir / f"{fig.name}.png")
    write_readme(registry, tables, config, figures_dir)
    print(f"redrew {sum(f.name in tables for f in figures)} figure(s) from {results_dir}")
    return 0


def load_all_tables(registry, config, version):
    """Every figure's table from the cache (figures not run now keep their last results)."""
    import pandas as pd

    results_dir, _ = output_folders(config.mode)
    out = {}
    for name, fig in registry.items():
        jobs = [Job(name, c, cell_key(name, c, version)) for c in fig.cells(config)]
        if all(cache_problem(j) is None for j in jobs):
            out[name] = tables([fig], {name: jobs})[name]
        elif (results_dir / f"{name}.csv").exists():
            try:
                out[name] = pd.read_csv(results_dir / f"{name}.csv")
            except Exception:  # noqa: BLE001 -- an empty or old table is simply not reported
                pass
    return out


if __name__ == "__main__":
    sys.exit(main())
