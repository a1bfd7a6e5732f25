"""Benchmark: search quality and search time of the schedulers (a benchmark, not a test).

Prints five sections and a compact table at the end:

(a) ILP (CP-SAT) on ``hetero16-two-region`` and ``hetero24-two-region`` for a PPO and a GRPO
    job: status, its own objective, its bound, the wall time, and the plan's time under the full
    cost model (the ILP optimises a linearised model over a block-aligned space; see
    docs/baselines.md).
(b) SHA-EA (``hetrl``) on the same instances with a wall-clock budget: its iteration time next to
    the ILP plan's, both from the full cost model, and the gap in percent (negative: SHA-EA found
    a better plan than the ILP's, which can happen because the ILP's space and model are coarser).
(c) ``paper64-multi-country`` (qwen3-8b-ppo-sync): SHA-EA, DEAP, HetRL-simple and verl at
    several wall-clock budgets, and a long SHA-EA run as the reference "best found"; every result
    is printed as a gap to the best plan seen in this section.
(d) A 1024-GPU random cluster (128 nodes of 8 GPUs over 16 regions): the time SHA-EA needs to
    return a valid plan.
(e) Convergence (issue 39's targets) on eight jobs at their presets' batches: the best at 3,000
    and 30,000 evaluations against a ``--reference-s`` search, when each first came within
    2% of the best of them, and what a search given the time target's seconds (10 s; 120 s on
    1,024 GPUs) ends with (``--only convergence --parallel 2``: about an hour on 2 cores with
    the 600 s reference).
(f) The figures' searches (``--only figures --parallel 2``, about 5 minutes on 2 cores): fig3's
    16 HetRL jobs at the figures' default batch (96 prompts) at 3,000, 10,000 and 30,000
    evaluations, each against the best of the three.

Every search runs in a fresh process, so none inherits the caches (or the memory) of the one
before it. Run: ``python experiments/bench_search.py [--quick] [--workers N] [--reference-s S]``.
Full mode takes about 35 minutes on 2 cores; ``--quick`` about 10.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

from hetrl.errors import HetrlError  # noqa: E402
from hetrl.plan import validate  # noqa: E402
from hetrl.search import Budget, SearchResult, get_scheduler  # noqa: E402
from hetrl.spec.presets import cluster_preset, workload_preset  # noqa: E402
from hetrl.spec.random_cluster import random_cluster  # noqa: E402

SMALL_CLUSTERS = ("hetero16-two-region", "hetero24-two-region")
SMALL_WORKLOADS = ("qwen3-8b-ppo-sync", "qwen3-8b-grpo-sync")
PAPER_CLUSTER = "paper64-multi-country"
PAPER_WORKLOAD = "qwen3-8b-ppo-sync"
COMPARED = ("hetrl", "deap", "hetrl-simple", "verl")


@dataclass
class Row:
    section: str
    instance: str
    scheduler: str
    budget: str
    iteration_s: float | None
    wall_s: float
    note: str = ""


def say(text: str = "") -> None:
    print(text, flush=True)


def _search_here(name: str, workload, cluster, budget: Budget
                 ) -> tuple[SearchResult | None, float, str]:
    """One search in this process: (result or None, wall seconds, error text)."""
    t0 = time.perf_counter()
    try:
        result = get_scheduler(name).search(workload, cluster, budget)
    except HetrlError as exc:
        return None, time.perf_counter() - t0, str(exc)
    return result, time.perf_counter() - t0, ""


def run(name: str, workload, cluster, budget: Budget) -> tuple[SearchResult | None, float, str]:
    """One search in a fresh (spawned) process: (result or None, wall seconds of the search
    alone, error text). Every scheduler starts with the cost model's caches empty, whatever ran
    before it: in one process the first search of a cluster filled its link and hardware caches
    for the searches after it (so at 5 s the first scheduler, hetrl, ran at a disadvantage), and
    the memory a long search left behind slowed the next."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        result, wall, err = pool.submit(_search_here, name, workload, cluster, budget).result()
    if result is not None:
        validate(result.plan, workload, cluster)
    return result, wall, err


def load() -> str:
    """The 1-minute load average (timings on a shared machine need it next to them)."""
    try:
        return f"load {os.getloadavg()[0]:.1f}"
    except OSError:  # pragma: no cover - platforms without getloadavg
        return "load ?"


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def gap(x: float | None, ref: float | None) -> str:
    if x is None or ref is None:
        return "-"
    return f"{100 * (x - ref) / ref:+.2f}%"


def section_small(args, rows: list[Row]) -> None:
    say(f"== (a) ILP, {args.ilp_limit:g} s limit, {args.workers} solver worker(s); "
        f"(b) SHA-EA, {args.sha_s:g} s ==")
    say(f"{'instance':<42} {'status':<9} {'obj s':>8} {'bound s':>8} {'wall s':>7} "
        f"{'ILP plan s':>10} {'SHA-EA s':>9} {'SHA wall':>8} {'gap':>8}")
    for wname in SMALL_WORKLOADS:
        wl = workload_preset(wname)
        for cname in SMALL_CLUSTERS:
            cl = cluster_preset(cname)
            inst = f"{wname} @ {cname}"
            ilp, ilp_wall, err = run("ilp", wl, cl, Budget(seconds=args.ilp_limit, seed=args.seed,
                                                           workers=args.workers))
            sha, sha_wall, err2 = run("hetrl", wl, cl, Budget(seconds=args.sha_s, seed=args.seed))
            ilp_s = ilp.estimate.iteration_s if ilp else None
            sha_s = sha.estimate.iteration_s if sha else None
            status = str(ilp.extra.get("ilp_status", "?")).split(" ")[0] if ilp else "ERROR"
            obj = ilp.extra.get("ilp_objective_s") if ilp else None
            bound = ilp.extra.get("ilp_bound_s") if ilp else None
            say(f"{inst:<42} {status:<9} {fmt(obj):>8} {fmt(bound):>8} {ilp_wall:>7.1f} "
                f"{fmt(ilp_s):>10} {fmt(sha_s):>9} {sha_wall:>8.1f} {gap(sha_s, ilp_s):>8}  {load()}")
            if err or err2:
                say(f"    errors: {err} {err2}")
            if ilp:
                say(f"    ILP: {ilp.extra.get('ilp_candidates')} candidates, status "
                    f"{ilp.extra.get('ilp_status')}, solver {fmt(ilp.extra.get('ilp_solve_s'), 1)} s")
            rows.append(Row("a", inst, "ilp", f"{args.ilp_limit:g}s", ilp_s, ilp_wall,
                            f"{status} obj={fmt(obj)} bound={fmt(bound)}"))
            rows.append(Row("b", inst, "hetrl", f"{args.sha_s:g}s", sha_s, sha_wall,
                            f"gap to ILP plan {gap(sha_s, ilp_s)}"))
    say()


def section_paper(args, rows: list[Row]) -> None:
    wl, cl = workload_preset(PAPER_WORKLOAD), cluster_preset(PAPER_CLUSTER)
    inst = f"{PAPER_WORKLOAD} @ {PAPER_CLUSTER}"
    say(f"== (c) {inst}: budgets {', '.join(f'{b:g}' for b in args.budgets)} s; reference: "
        f"SHA-EA {args.reference_s:g} s ==")
    results: dict[tuple[str, float], tuple[float | None, float, int]] = {}
    for b in args.budgets:
        for name in COMPARED:
            r, wall, err = run(name, wl, cl, Budget(seconds=b, seed=args.seed))
            results[(name, b)] = (r.estimate.iteration_s if r else None, wall,
                                  r.evaluations if r else 0)
            say(f"  {name:<13} {b:>5g} s: {fmt(results[(name, b)][0]):>8} s/iter "
                f"({results[(name, b)][2]} evaluations, {wall:.1f} s wall, {load()})"
                f"{' ' + err if err else ''}")
    ref, ref_wall, _ = run("hetrl", wl, cl, Budget(seconds=args.reference_s, seed=args.seed + 1))
    ref_s = ref.estimate.iteration_s if ref else None
    say(f"  reference SHA-EA {args.reference_s:g} s (seed {args.seed + 1}): {fmt(ref_s)} s/iter "
        f"({ref.evaluations if ref else 0} evaluations, {ref_wall:.1f} s wall, {load()})")
    seen = [v[0] for v in results.values() if v[0] is not None] + ([ref_s] if ref_s else [])
    best = min(seen) if seen else None
    say(f"  best found: {fmt(best)} s/iter")
    say(f"  {'budget':>8} " + " ".join(f"{n:>13}" for n in COMPARED) + "   (gap to best found)")
    for b in args.budgets:
        say(f"  {b:>7g}s " + " ".join(f"{gap(results[(n, b)][0], best):>13}" for n in COMPARED))
    for (name, b), (s, wall, _) in results.items():
        rows.append(Row("c", inst, name, f"{b:g}s", s, wall, f"gap to best {gap(s, best)}"))
    rows.append(Row("c", inst, "hetrl (reference)", f"{args.reference_s:g}s", ref_s, ref_wall,
                    f"gap to best {gap(ref_s, best)}"))
    last = max(args.budgets)
    say(f"  SHA-EA at {last:g} s vs the reference: {gap(results[('hetrl', last)][0], ref_s)} "
        f"(vs best found: {gap(results[('hetrl', last)][0], best)})")
    say()


def section_large(args, rows: list[Row]) -> None:
    t0 = time.perf_counter()
    cl = random_cluster(seed=args.seed, num_nodes=128, num_regions=16, gpus_per_node=(8,),
                        name="random-1024")
    build_s = time.perf_counter() - t0
    wl = workload_preset(PAPER_WORKLOAD)
    inst = f"{PAPER_WORKLOAD} @ random-1024 ({cl.num_devices} GPUs, 16 regions)"
    say(f"== (d) {inst}; cluster built in {build_s:.1f} s ==")
    for b in args.large_budgets:
        r, wall, err = run("hetrl", wl, cl, Budget(seconds=b, seed=args.seed))
        first = r.history[0][0] if r and r.history else None
        say(f"  SHA-EA {b:g} s budget: {fmt(r.estimate.iteration_s if r else None)} s/iter, valid "
            f"plan, {r.evaluations if r else 0} evaluations, first plan after {fmt(first)} s, "
            f"{wall:.1f} s wall, {load()}{' ' + err if err else ''}")
        rows.append(Row("d", inst, "hetrl", f"{b:g}s", r.estimate.iteration_s if r else None, wall,
                        f"first plan at {fmt(first)} s; {r.evaluations if r else 0} evals"))
    say()


#: section (e)'s jobs: docs/search.md's convergence table, then four more (a three-site fleet,
#: a 24-GPU two-region cluster, a larger model on 48 GPUs, and 1,024 GPUs), each at the
#: workload preset's own batch
CONVERGENCE_JOBS = (
    ("qwen3-8b-ppo-sync", "paper64-multi-country"),
    ("qwen3-8b-ppo-async", "paper64-single-region"),
    ("qwen3-8b-grpo-async", "paper64-multi-continent"),
    ("qwen3-8b-grpo-sync", "paper64-multi-region-hybrid"),
    ("qwen3-8b-ppo-sync", "examples/cluster-fleet.yaml"),
    ("qwen3-8b-ppo-sync", "hetero24-two-region"),
    ("qwen3-14b-grpo-sync", "paper48-a100-l40s-single-region"),
    ("qwen3-8b-ppo-sync", "random-1024"),
)
#: issue 39's targets: 3,000 within 3% of 30,000; 30,000 within 1% of the reference; within
#: 2% of the reference after at most 10 s (64 GPUs) or 120 s (1,024 GPUs)
CONVERGENCE_EVALS = (3_000, 30_000)


def _convergence_cluster(name: str, seed: int):
    if name == "random-1024":
        return random_cluster(seed=seed, num_nodes=128, num_regions=16, gpus_per_node=(8,),
                              name="random-1024")
    if name.endswith(".yaml"):
        from hetrl.io import load_cluster

        return load_cluster(Path(__file__).resolve().parents[1] / name)
    return cluster_preset(name)


def _within(result: SearchResult | None, ref: float | None, slack: float) -> float | None:
    """Seconds into ``result``'s search at which its best first came within ``slack`` of
    ``ref`` (None: never)."""
    if result is None or ref is None:
        return None
    return next((t for t, _, s in result.history if s <= ref * (1 + slack)), None)


def _time_target(cluster: str) -> float:
    """Issue 39's wall-clock target, seconds: within 2% of the reference after at most this."""
    return 120.0 if cluster == "random-1024" else 10.0


def _convergence_job(args, workload: str, cluster: str) -> list[tuple[str, SearchResult | None,
                                                                       float, str]]:
    """The job's searches: 3,000 and 30,000 evaluations, the reference, and a search given the
    wall-clock target's seconds (what a user with that deadline gets: a time budget's phases
    scale to it, so a longer search's history does not tell)."""
    wl, cl = workload_preset(workload), _convergence_cluster(cluster, args.seed)
    out = []
    for n in CONVERGENCE_EVALS:
        out.append((f"{n}", *run("hetrl", wl, cl, Budget(evaluations=n, seed=args.seed))))
    for s in (args.reference_s, _time_target(cluster)):
        out.append((f"{s:g}s", *run("hetrl", wl, cl, Budget(seconds=s, seed=args.seed))))
    return out


def section_convergence(args, rows: list[Row]) -> None:
    """(e) issue 39's targets: per job, the best at 3,000 and 30,000 evaluations and after a
    ``--reference-s`` search, the gaps, and how soon a plan within 2% of the best of them came:
    the first second at which one of those runs had it (from its history), and what a search
    given the target's seconds (10 s; 120 s on 1,024 GPUs) ended with. The time target holds
    when either reached it. Jobs run ``--parallel`` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    say(f"== (e) convergence: {', '.join(f'{n:,}' for n in CONVERGENCE_EVALS)} evaluations, "
        f"a {args.reference_s:g} s reference and a search of the time target's seconds, seed "
        f"{args.seed}, {args.parallel} job(s) at a time ==")
    say(f"{'job':<58} {'3,000':>8} {'30,000':>8} {'ref':>8} {'3k/30k':>8} {'30k/ref':>8} "
        f"{'2% at':>7} {'target':>6} {'timed':>8} {'t/ref':>8}  ok")
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = [(w, c, pool.submit(_convergence_job, args, w, c))
                   for w, c in CONVERGENCE_JOBS]
        for w, c, fut in futures:
            runs = fut.result()
            (_, small, *_), (_, big, *_), (_, ref, *_), (_, timed, *_) = runs
            s3, s30, sr, st = (r.estimate.iteration_s if r else None
                               for r in (small, big, ref, timed))
            best_ref = min((x for x in (s3, s30, sr, st) if x is not None), default=None)
            # when a run first came within 2% of the best of them (the reference, unless a
            # shorter run found better)
            reach = [t for t in (_within(r, best_ref, 0.02) for r in (small, big, ref))
                     if t is not None]
            at = min(reach) if reach else None
            limit = _time_target(c)
            in_time = ((at is not None and at <= limit)
                       or (st is not None and best_ref is not None and st <= 1.02 * best_ref))
            ok = (s3 is not None and s30 is not None and best_ref is not None
                  and s3 <= 1.03 * s30 and s30 <= 1.01 * best_ref and in_time)
            say(f"{w + ' @ ' + c:<58} {fmt(s3):>8} {fmt(s30):>8} {fmt(sr):>8} "
                f"{gap(s3, s30):>8} {gap(s30, best_ref):>8} {fmt(at, 1):>7} {limit:>6g} "
                f"{fmt(st):>8} {gap(st, best_ref):>8}  {'yes' if ok else 'no'}  "
                f"({ref.evaluations if ref else 0:,} evals in the reference, {load()})")
            for label, r, wall, err in runs:
                rows.append(Row("e", f"{w} @ {c}", "hetrl", label,
                                r.estimate.iteration_s if r else None, wall,
                                (f"converged={r.converged}" if r else err)))
    say()


def _figure_setup() -> tuple[tuple[str, ...], int, tuple[int, ...]]:
    """Section (f)'s jobs, as fig3 defines its default mode: its scenarios (each with Qwen3-8B
    PPO and GRPO, sync and async), its batch (prompts), and the budgets: 3,000 and 10,000
    evaluations (the default mode's earlier budgets), the default mode's and --full's (each
    once)."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:  # (run as a script: experiments/ is not a package on the path)
        sys.path.insert(0, root)
    from experiments.common import batch_for
    from experiments.figures import fig3
    from experiments.framework import Config

    return (fig3.SCENARIOS, batch_for(Config("default")),
            tuple(sorted({3_000, 10_000, fig3.EVALUATIONS["default"], fig3.EVALUATIONS["full"]})))


def _figure_job(workload: str, cluster: str, batch: int, evals: int, seed: int
                ) -> tuple[SearchResult | None, float, str]:
    wl = workload_preset(workload).with_(batch_prompts=batch)
    return run("hetrl", wl, cluster_preset(cluster), Budget(evaluations=evals, seed=seed))


def section_figures(args, rows: list[Row]) -> None:
    """(f) How converged the figures' searches are: fig3's 16 HetRL jobs at the figures' batch,
    at 3,000, 10,000 and 30,000 evaluations, each against the best of the three (geometric
    mean of the gaps, jobs within 1% and 3% of it, searches that ended converged)."""
    from concurrent.futures import ThreadPoolExecutor

    scenarios, batch, budgets = _figure_setup()
    jobs = [(f"qwen3-8b-{alg}-{mode}", f"paper64-{scenario}")
            for scenario in scenarios for alg in ("ppo", "grpo") for mode in ("sync", "async")]
    say(f"== (f) the figures' searches: fig3's HetRL jobs, {batch} prompts, "
        f"{', '.join(f'{n:,}' for n in budgets)} evaluations, seed {args.seed}, "
        f"{args.parallel} search(es) at a time ==")
    say(f"{'job':<52} " + " ".join(f"{n:>9,}" for n in budgets) + "  (* converged)")
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = [(w, c, [pool.submit(_figure_job, w, c, batch, n, args.seed) for n in budgets])
                   for w, c in jobs]
        gaps: dict[int, list[float]] = {n: [] for n in budgets}
        converged = dict.fromkeys(budgets, 0)
        for w, c, futs in futures:
            results = [f.result() for f in futs]
            times = [r.estimate.iteration_s if r else None for r, _, _ in results]
            best = min((x for x in times if x is not None), default=None)
            for n, (r, wall, err), x in zip(budgets, results, times, strict=True):
                if x is not None and best is not None:
                    gaps[n].append(x / best - 1)
                    converged[n] += bool(r.converged)
                rows.append(Row("f", f"{w} @ {c}", "hetrl", f"{n}", x, wall,
                                f"converged={r.converged}" if r else err))
            say(f"{w + ' @ ' + c:<52} " + " ".join(
                f"{fmt(x):>8}{'*' if r and r.converged else ' '}"
                for (r, _, _), x in zip(results, times, strict=True)))
    for n in budgets:
        g = gaps[n]
        if g:
            mean = math.exp(sum(math.log1p(x) for x in g) / len(g)) - 1
            say(f"  {n:>6,} evaluations: {100 * mean:+.2f}% over the best of the three "
                f"(geometric mean); within 1%: {sum(x <= 0.01 for x in g)}/{len(g)}, within 3%: "
                f"{sum(x <= 0.03 for x in g)}/{len(g)}; converged {converged[n]}/{len(g)}")
    say()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter limits (about 10 minutes)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="CP-SAT workers for the ILP (default: all cores)")
    ap.add_argument("--reference-s", type=float, default=None,
                    help="SHA-EA reference run in (c), seconds (default 600; --quick 60)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parallel", type=int, default=1,
                    help="(e) jobs run at a time, each search in its own process (default 1)")
    ap.add_argument("--only", choices=("small", "paper", "large", "convergence", "figures"),
                    action="append",
                    help="run only these sections (repeatable)")
    args = ap.parse_args(argv)
    if args.quick:
        args.ilp_limit, args.sha_s = 60.0, 20.0
        args.budgets = (5.0, 15.0, 30.0, 60.0)
        args.large_budgets = (30.0,)
    else:
        args.ilp_limit, args.sha_s = 180.0, 60.0
        args.budgets = (5.0, 15.0, 30.0, 60.0)
        args.large_budgets = (60.0, 300.0)
    if args.reference_s is None:
        args.reference_s = 60.0 if args.quick else 600.0
    say(f"bench_search: python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} cores; mode {'quick' if args.quick else 'full'}; seed {args.seed}")
    say()
    rows: list[Row] = []
    t0 = time.perf_counter()
    sections = args.only or ["small", "paper", "large", "convergence", "figures"]
    if "small" in sections:
        section_small(args, rows)
    if "paper" in sections:
        section_paper(args, rows)
    if "large" in sections:
        section_large(args, rows)
    if "convergence" in sections:
        section_convergence(args, rows)
    if "figures" in sections:
        section_figures(args, rows)
    say(f"== summary ({time.perf_counter() - t0:.0f} s in all) ==")
    say(f"{'sec':<3} {'instance':<44} {'scheduler':<18} {'budget':>6} {'iter s':>8} "
        f"{'wall s':>7}  note")
    for r in rows:
        say(f"{r.section:<3} {r.instance[:44]:<44} {r.scheduler:<18} {r.budget:>6} "
            f"{fmt(r.iteration_s):>8} {r.wall_s:>7.1f}  {r.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
