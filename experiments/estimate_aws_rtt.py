"""Extend the shipped AWS round-trip matrix to every commercial AWS region by a great-circle
estimate, calibrated on the measured cells (hetrl/data/README.md, "Regions beyond the paper's
ten"). Reproducible: reads ``hetrl/data/aws_regions.csv`` (codes, cities, coordinates) and the
measured cells of ``aws_rtt_ms.csv`` (source C or A in ``aws_rtt_source.csv``), fits

    RTT_ms = overhead_ms + 2 x great_circle_km x inflation / c_fiber,   c_fiber = 2e5 km/s

by least squares, prints the fit and its error on the measured pairs, and with ``--write``
rewrites the three matrices: every measured (C, A) or older estimated (E) cell kept as it is,
every other cell the fit rounded to 0.5 ms with source G, bandwidth min(5 Gbps, 12 MiB / RTT).

    python -m experiments.estimate_aws_rtt [--write]
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "hetrl" / "data"
C_FIBER_KM_S = 2.0e5  # light in fibre: c / n with n ~ 1.47 (about 204,000 km/s)
EARTH_KM = 6371.0
WINDOW_BITS = 12 * 2 ** 20 * 8  # a 12 MiB TCP window
FLOW_CAP_GBPS = 5.0  # AWS: one flow outside a placement group


def regions() -> dict[str, tuple[float, float]]:
    with (DATA / "aws_regions.csv").open() as fh:
        return {r["region"]: (float(r["latitude"]), float(r["longitude"]))
                for r in csv.DictReader(fh)}


def great_circle_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    (la1, lo1), (la2, lo2) = a, b
    p1, p2, dl = math.radians(la1), math.radians(la2), math.radians(lo2 - lo1)
    h = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_KM * math.asin(math.sqrt(h))


def read_matrix(name: str) -> dict[tuple[str, str], str]:
    with (DATA / name).open() as fh:
        rows = list(csv.reader(fh))
    header = rows[0][1:]
    return {(row[0], col): cell for row in rows[1:] for col, cell in zip(header, row[1:],
                                                                             strict=True)}


def fit(coords: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Least squares of RTT on the fibre time 2 d / c over the measured pairs: overhead and
    inflation, and (for comparison) the inflation alone through the origin; their errors."""
    rtt, source = read_matrix("aws_rtt_ms.csv"), read_matrix("aws_rtt_source.csv")
    xs, ys = [], []
    for (a, b), s in source.items():
        if a < b and s in ("C", "A"):
            xs.append(2 * great_circle_km(coords[a], coords[b]) / C_FIBER_KM_S * 1e3)
            ys.append(float(rtt[(a, b)]))
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    a = my - k * mx
    k0 = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)

    def errors(f) -> tuple[float, float, float]:
        e = [f(x) - y for x, y in zip(xs, ys, strict=True)]
        rmse = math.sqrt(sum(v * v for v in e) / n)
        mape = sum(abs(v) / y for v, y in zip(e, ys, strict=True)) / n
        return rmse, max(abs(v) for v in e), mape

    rmse, worst, mape = errors(lambda x: a + k * x)
    rmse0, worst0, mape0 = errors(lambda x: k0 * x)
    return {"pairs": n, "overhead_ms": a, "inflation": k, "rmse_ms": rmse, "max_ms": worst,
            "mape": mape, "inflation_only": k0, "rmse_only_ms": rmse0, "max_only_ms": worst0,
            "mape_only": mape0}


def estimate_ms(f: dict[str, float], km: float) -> float:
    return round(2 * (f["overhead_ms"] + 2 * km / C_FIBER_KM_S * 1e3 * f["inflation"])) / 2


def bandwidth_gbps(rtt_ms: float) -> float:
    return min(FLOW_CAP_GBPS, WINDOW_BITS / (rtt_ms / 1e3) / 1e9)


def write(coords: dict[str, tuple[float, float]], f: dict[str, float]) -> None:
    rtt, source = read_matrix("aws_rtt_ms.csv"), read_matrix("aws_rtt_source.csv")
    bw = read_matrix("aws_bandwidth_gbps.csv")
    names = list(coords)
    out_rtt, out_src, out_bw = [["rtt_ms", *names]], [["source", *names]], [["gbps", *names]]
    for a in names:
        r_row, s_row, b_row = [a], [a], [a]
        for b in names:
            if a == b:
                r_row.append("0"), s_row.append("-"), b_row.append("")
            elif (a, b) in rtt:  # measured (or the older E estimate): kept as it is
                r_row.append(rtt[(a, b)]), s_row.append(source[(a, b)])
                b_row.append(bw[(a, b)])
            else:
                ms = estimate_ms(f, great_circle_km(coords[a], coords[b]))
                r_row.append(f"{ms:g}"), s_row.append("G")
                b_row.append(f"{bandwidth_gbps(ms):.2f}")
        out_rtt.append(r_row), out_src.append(s_row), out_bw.append(b_row)
    for name, rows in (("aws_rtt_ms.csv", out_rtt), ("aws_rtt_source.csv", out_src),
                       ("aws_bandwidth_gbps.csv", out_bw)):
        with (DATA / name).open("w", newline="") as fh:
            csv.writer(fh, lineterminator="\n").writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the three matrices")
    args = parser.parse_args()
    coords = regions()
    f = fit(coords)
    print(f"fit on {f['pairs']} measured pairs: RTT = {f['overhead_ms']:.2f} ms + 2 d x "
          f"{f['inflation']:.3f} / c_fiber; RMSE {f['rmse_ms']:.1f} ms, max {f['max_ms']:.1f} "
          f"ms, mean |error| / RTT {100 * f['mape']:.0f}%")
    print(f"(inflation alone, through the origin: {f['inflation_only']:.3f}; RMSE "
          f"{f['rmse_only_ms']:.1f} ms, max {f['max_only_ms']:.1f} ms, mean |error| / RTT "
          f"{100 * f['mape_only']:.0f}%)")
    if args.write:
        write(coords, f)
        print(f"wrote the matrices for {len(coords)} regions under {DATA}")


if __name__ == "__main__":
    main()
