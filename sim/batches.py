"""Micro-batches of sampled sequences, as the cost model counts them (:mod:`hetrl.cost.batching`):
by sequence count in sampled order, or by a token budget B -- m = min(ceil(T / B), n)
micro-batches (verl's ``rearrange_micro_batches`` count, the largest over the data-parallel
replicas) cut from the sampled order where the running token sum is nearest each k T / m, so
each holds about T / m tokens -- and the tokens a
micro-batch costs: its real ones, or each sequence padded to the micro-batch's longest or to the
longest possible."""

from __future__ import annotations

import numpy as np

from hetrl.cost.batching import Batching


def split_replicas(parts: list[np.ndarray], lengths: np.ndarray,
                   batching: int | Batching) -> list[list[np.ndarray]]:
    """The micro-batches of each data-parallel replica's samples ``parts`` for one optimizer
    step. By a token budget every replica takes the largest count, as verl all-reduces
    ``num_micro_batches`` with MAX over the data-parallel group (and a pipeline schedule, or
    FSDP's lockstep collectives, needs one count)."""
    tokens = None if isinstance(batching, int) else batching.tokens
    if tokens is None:
        return [split(part, lengths, batching) for part in parts]
    count = max([-(-int(lengths[part].sum()) // tokens) for part in parts] + [1])
    return [split(part, lengths, batching, count) for part in parts]


def split(part: np.ndarray, lengths: np.ndarray, batching: int | Batching,
          count: int | None = None) -> list[np.ndarray]:
    """The micro-batches (arrays of sample indices) of one replica's samples ``part`` (in
    sampled order), ``lengths`` indexed by sample; by a token budget ``count`` of them if given
    (at most one per sample)."""
    n = len(part)
    tokens = None if isinstance(batching, int) else batching.tokens
    if tokens is None:
        mbs = batching if isinstance(batching, int) else batching.sequences
        return [part[k:k + mbs] for k in range(0, n, mbs)]
    if n == 0:
        return []
    cum = np.cumsum(lengths[part].astype(np.int64))
    total = int(cum[-1])
    m = max(1, min(-(-total // tokens) if count is None else count, n))
    cuts: list[int] = []  # sequences before each cut
    for k in range(1, m):
        target = total * k / m
        i = int(np.searchsorted(cum, target))  # cum[i] >= target > cum[i - 1]
        c = i if i > 0 and target - cum[i - 1] <= cum[i] - target else i + 1
        lo = cuts[-1] + 1 if cuts else 1
        cuts.append(min(max(c, lo), n - (m - k)))
    return np.split(part, cuts)


def costed(micro: list[np.ndarray], lengths: np.ndarray,
           batching: int | Batching) -> tuple[list[float], list[float]]:
    """Per micro-batch (tokens, sum of squared lengths) as costed: real lengths with padding
    removed; else every sequence as long as the micro-batch's longest (``pad_to: longest``) or
    as the longest possible, prompt max + response max (``max``)."""
    padding = "none" if isinstance(batching, int) else batching.padding
    tok, sq = [], []
    for mb in micro:
        lens = lengths[mb].astype(float)
        if padding == "none":
            tok.append(float(lens.sum()))
            sq.append(float((lens ** 2).sum()))
            continue
        assert isinstance(batching, Batching)
        longest = float(batching.prompt.max + batching.response.max) if padding == "max" \
            else float(lens.max()) if lens.size else 0.0
        tok.append(lens.size * longest)
        sq.append(lens.size * longest * longest)
    return tok, sq
