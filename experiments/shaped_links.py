"""Collectives over slow links, measured: two network namespaces joined by a veth pair whose
both directions are shaped with the kernel's traffic control (htb) to the paper's link classes,
torch.distributed's gloo all-reduce, broadcast and point-to-point transfers between a process on
either side, against the cost model's and the simulator's times for the same collectives.

    sudo PYTHONPATH=. python experiments/shaped_links.py [--sizes-mb 1,4,16,64,256,1024]
        [--classes inter-region,cross-country,edge] [--reps 2] [--json] [--out FILE]

Needs root (``ip netns``, ``tc``) and torch. The kernel here has htb but no netem, so the links
get bandwidth and no added delay (the delay a link class has, 5-30 ms, is left out of both the
measurement and the model it is held against; the script says so in its output). Each (class,
operation, size) is timed ``--reps`` times after a warm-up, on both ranks, and the slower
rank's median is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: The paper's link classes (Sec. 5, "Network scenarios"): the 5 Gbps between Ohio and
#: Virginia, the slowest pair of the Multi-Country regions (1.9 Gbps) and the 1 Gbps edge.
LINK_CLASSES = {"inter-region": 5.0, "cross-country": 1.9, "edge": 1.0}
OPS = ("all_reduce", "broadcast", "p2p")
NS = ("hetrl-shape-a", "hetrl-shape-b")
DEV = ("hetrl-va", "hetrl-vb")
ADDR = ("10.251.0.1", "10.251.0.2")
PORT = 29731


@dataclass(frozen=True)
class Measured:
    """One collective over one shaped link: its median seconds (the slower rank's)."""

    link: str
    gbps: float
    op: str
    nbytes: int
    seconds: float


def can_shape() -> str | None:
    """None where this machine can make shaped namespaces, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command"
    try:
        _run(["ip", "netns", "add", "hetrl-probe"])
        _run(["ip", "netns", "del", "hetrl-probe"])
    except subprocess.CalledProcessError as exc:
        return f"ip netns refused: {exc.stderr.strip()}"
    return None


def has_netem() -> bool:
    """Whether the kernel's netem qdisc (link delay) is available."""
    try:
        _run(["ip", "link", "add", "hetrl-nd", "type", "dummy"])
    except subprocess.CalledProcessError:
        return False
    try:
        _run(["tc", "qdisc", "add", "dev", "hetrl-nd", "root", "netem", "delay", "1ms"])
        return True
    except subprocess.CalledProcessError:
        return False
    finally:
        subprocess.run(["ip", "link", "del", "hetrl-nd"], capture_output=True)


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def teardown() -> None:
    """Remove the namespaces (and with them the veth pair); quiet if absent."""
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def setup(gbps: float) -> None:
    """Two namespaces joined by a veth pair, each direction shaped to ``gbps`` Gbit/s (htb)."""
    teardown()
    for ns in NS:
        _run(["ip", "netns", "add", ns])
    _run(["ip", "link", "add", DEV[0], "type", "veth", "peer", "name", DEV[1]])
    for ns, dev, addr in zip(NS, DEV, ADDR, strict=True):
        _run(["ip", "link", "set", dev, "netns", ns])
        _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
        _run(["ip", "-n", ns, "link", "set", dev, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        rate = f"{int(gbps * 1000)}mbit"
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "handle",
              "1:", "htb", "default", "10", "r2q", "1000"])
        _run(["ip", "netns", "exec", ns, "tc", "class", "add", "dev", dev, "parent", "1:",
              "classid", "1:10", "htb", "rate", rate, "ceil", rate])


# --- the two processes ----------------------------------------------------------------------

def worker(rank: int, sizes: Sequence[int], reps: int, out: Path) -> None:
    """One rank: every operation at every size, ``reps`` timed runs after a warm-up; writes
    {op: {nbytes: [seconds, ...]}} to ``out``."""
    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = DEV[rank]
    dist.init_process_group("gloo", init_method=f"tcp://{ADDR[0]}:{PORT}", rank=rank,
                            world_size=2)
    times: dict[str, dict[int, list[float]]] = {op: {} for op in OPS}
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        for op in OPS:
            runs = []
            for i in range(reps + 1):
                dist.barrier()
                start = time.perf_counter()
                if op == "all_reduce":
                    dist.all_reduce(t)
                elif op == "broadcast":
                    dist.broadcast(t, src=0)
                elif rank == 0:
                    dist.send(t, dst=1)
                else:
                    dist.recv(t, src=0)
                if op == "p2p":
                    dist.barrier()  # (the sender returns when its bytes are out, not received)
                if i:  # (the first run warms the connection up)
                    runs.append(time.perf_counter() - start)
            times[op][nbytes] = runs
        del t
    dist.destroy_process_group()
    out.write_text(json.dumps(times))


def measure_link(link: str, gbps: float, sizes: Sequence[int], reps: int,
                 timeout_s: float = 900) -> list[Measured]:
    """Shape the pair to ``gbps``, run both ranks, and return the slower rank's medians."""
    setup(gbps)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            outs = [Path(tmp) / f"rank{r}.json" for r in (0, 1)]
            env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
            procs = [subprocess.Popen(
                ["ip", "netns", "exec", NS[r], sys.executable, "-m", "experiments.shaped_links",
                 "worker", "--rank", str(r), "--sizes", ",".join(map(str, sizes)), "--reps",
                 str(reps), "--out", str(outs[r])], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
            for p in procs:
                out, _ = p.communicate(timeout=timeout_s)
                if p.returncode:
                    raise RuntimeError(f"a rank failed on {link}: {out[-2000:]}")
            ranks = [json.loads(o.read_text()) for o in outs]
    finally:
        teardown()
    return [Measured(link, gbps, op, nbytes,
                     max(statistics.median(r[op][str(nbytes)]) for r in ranks))
            for op in OPS for nbytes in sizes]


# --- what hetrl says ------------------------------------------------------------------------

def two_node_cluster(gbps: float):
    """The measured pair as hetrl sees it: one device in each of two regions joined by a link of
    ``gbps`` and no latency (nothing delays the veth pair)."""
    from hetrl.spec.cluster import ClusterSpec

    return ClusterSpec.from_dict({
        "name": f"shaped-{gbps:g}gbps",
        "nodes": [{"name": "a", "gpu": "A100", "count": 1, "region": "ra"},
                  {"name": "b", "gpu": "A100", "count": 1, "region": "rb"}],
        "region_links": [{"a": "ra", "b": "rb", "latency_ms": 0, "bandwidth_gbps": gbps}]})


def model_seconds(op: str, nbytes: int, gbps: float, params=None) -> float:
    """The cost model's time of ``op`` moving ``nbytes`` between the two devices."""
    from hetrl.cost.params import DEFAULT_PARAMS
    from hetrl.cost.primitives import (
        all_reduce_time,
        broadcast_time,
        group_links,
        p2p_time,
    )

    params = params or DEFAULT_PARAMS
    cluster = two_node_cluster(gbps)
    eff = params.efficiency(cluster.device(0).gpu.name, "link")
    if op == "p2p":
        return p2p_time(nbytes, cluster.topology.latency_s[0, 1],
                        cluster.topology.bandwidth_Bps[0, 1], eff)
    g = group_links(cluster, (0, 1))
    return (all_reduce_time if op == "all_reduce" else broadcast_time)(nbytes, g, eff)


def simulator_seconds(op: str, nbytes: int, gbps: float, params=None) -> float:
    """The simulator's time of the same transfer: its network replays the bytes each direction
    carries as flows over the link (an all-reduce of two ranks sends ``nbytes`` each way)."""
    import simpy

    from hetrl.cost.params import DEFAULT_PARAMS
    from sim.network import Network

    params = params or DEFAULT_PARAMS
    cluster = two_node_cluster(gbps)
    env = simpy.Environment()
    net = Network(env, cluster, lambda d: params.efficiency(cluster.device(d).gpu.name, "link"))
    flows = [(0, 1), (1, 0)] if op == "all_reduce" else [(0, 1)]
    for src, dst in flows:
        net.transfer(src, dst, nbytes)  # (a process of its own)
    env.run()
    return env.now


# --- the report -----------------------------------------------------------------------------

def compare(measured: Sequence[Measured]) -> list[dict]:
    """Per measurement the model's and the simulator's seconds and their ratios to it."""
    rows = []
    for m in measured:
        est = model_seconds(m.op, m.nbytes, m.gbps)
        sim = simulator_seconds(m.op, m.nbytes, m.gbps)
        rows.append({"link": m.link, "gbps": m.gbps, "op": m.op, "mb": m.nbytes / 2**20,
                     "measured_s": m.seconds, "model_s": est, "model_ratio": est / m.seconds,
                     "sim_s": sim, "sim_ratio": sim / m.seconds,
                     "achieved_gbps": m.nbytes * 8 / m.seconds / 1e9})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker", help="(internal) one rank")
    w.add_argument("--rank", type=int, required=True)
    w.add_argument("--sizes", required=True)
    w.add_argument("--reps", type=int, required=True)
    w.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes-mb", default="1,4,16,64,256,1024",
                    help="message sizes in MiB (default 1,4,16,64,256,1024)")
    ap.add_argument("--classes", default=",".join(LINK_CLASSES),
                    help=f"link classes to shape (default all: {', '.join(LINK_CLASSES)})")
    ap.add_argument("--reps", type=int, default=2, help="timed runs per point (default 2)")
    ap.add_argument("--json", action="store_true", help="print machine-readable JSON")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.cmd == "worker":
        worker(args.rank, [int(s) for s in args.sizes.split(",")], args.reps, args.out)
        return 0
    why = can_shape()
    if why:
        print(f"shaped_links: cannot shape links here: {why}", file=sys.stderr)
        return 2
    classes = args.classes.split(",")
    for c in classes:
        if c not in LINK_CLASSES:
            print(f"shaped_links: --classes: unknown class {c!r}; classes: "
                  f"{list(LINK_CLASSES)}", file=sys.stderr)
            return 2
    sizes = [int(float(s) * 2**20) for s in args.sizes_mb.split(",")]
    measured = []
    for c in classes:
        measured += measure_link(c, LINK_CLASSES[c], sizes, args.reps)
    rows = compare(measured)
    report = {"netem": has_netem(), "rows": rows,
              "delay": "none: the links are shaped in bandwidth only (htb); "
                       + ("netem exists but is not used" if has_netem()
                          else "this kernel has no netem")}
    if args.out:
        from hetrl.io import write_text_atomic

        write_text_atomic(args.out, json.dumps(report, indent=2), "--out")
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"links shaped with htb, no delay ({report['delay']})")
    print(f"{'link':14s} {'op':10s} {'MiB':>6s} {'measured s':>11s} {'Gbps':>6s} "
          f"{'model s':>9s} {'ratio':>6s} {'sim s':>9s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['link']:14s} {r['op']:10s} {r['mb']:6.0f} {r['measured_s']:11.4f} "
              f"{r['achieved_gbps']:6.2f} {r['model_s']:9.4f} {r['model_ratio']:6.3f} "
              f"{r['sim_s']:9.4f} {r['sim_ratio']:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
