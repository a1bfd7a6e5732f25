"""Micro-batches of inference and training tasks: how many, and the tokens each one costs.

A replica's ``n`` sequences (per optimizer step) are split into micro-batches:

- by count (``micro_batch_size``, ``inference_micro_batch_size``): m = ceil(n / mbs);
- by a token budget B (``micro_batch_tokens``, ``inference_micro_batch_tokens``; verl's
  ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` / ``log_prob_max_token_len_per_gpu``):
  m = min(ceil(T / B), n) for the replica's T real tokens -- the count verl's
  ``rearrange_micro_batches`` takes before it balances the sequences over the m micro-batches
  (Karmarkar-Karp), so each holds about T / m <= B tokens. The workload requires
  B >= prompt max + response max, as verl asserts, so no sequence is ever alone by force.

Each micro-batch holds k = n / m sequences (fractional shares allowed, as everywhere in the cost
model). What it costs (docs/cost-model.md, "Micro-batches and padding"):

- ``remove_padding`` (verl ``use_remove_padding``, packed variable-length attention): its real
  tokens, k E[S], and attention k E[S^2] / 2 -- the cost model's formulas before this module;
- padded to the micro-batch's longest (``pad_to: longest``): k E[M_k] tokens and attention
  k E[M_k^2] / 2, M_k the longest of its k sequences;
- padded to the longest possible (``pad_to: max``, verl's static padding to max_prompt_length +
  max_response_length): k S_max tokens, attention k S_max^2 / 2.

E[M_k] and E[M_k^2]: a micro-batch's sequences are adjacent in the batch, and a prompt's g =
``responses_per_prompt`` responses are adjacent and share its prompt, so the k sequences are k / g'
prompt groups (g' = min(g, k)) of one prompt P and g' responses R: a group's longest is
G = P + max of g' R, with P(G <= s) = sum_p P(P = p) P(R <= s - p)^g', and the micro-batch's
longest has P(M_k <= s) = P(G <= s)^(k / g'). Exact when k divides g or is a multiple of it and
the micro-batches are aligned with prompt groups (a fractional number of groups otherwise);
between integer k the moments are interpolated linearly; a micro-batch that straddles groups
holds one more prompt than counted (slightly low).

Workload-level facts: a :class:`MicroBatcher` per (batching, length statistics) is memoised here
and its moments per integer k inside it; cost engines hold theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hetrl.cost.lengths import LengthStats
from hetrl.cost.memo import BATCHERS, Table
from hetrl.spec.lengths import LengthDist
from hetrl.spec.workload import WorkloadSpec

#: What one micro-batch's sequences cost: real tokens ("none": padding removed), each as long as
#: the micro-batch's longest ("longest") or as the longest possible ("max").
PADDING = ("none", "longest", "max")


@dataclass(frozen=True)
class Batching:
    """How a task kind's replica splits its sequences into micro-batches, where that differs from
    today's default (by count, padding removed: then :func:`micro_batching` gives the count)."""

    sequences: int  # sequences per micro-batch (when ``tokens`` is None)
    tokens: int | None  # token budget per micro-batch, or None
    padding: str  # one of PADDING
    prompt: LengthDist
    response: LengthDist
    group: int  # responses per prompt (adjacent, sharing the prompt)

    def __hash__(self) -> int:  # a memo key on the hot path: hashed once
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash((self.sequences, self.tokens, self.padding, self.prompt, self.response,
                     self.group))

    def __getstate__(self) -> dict:  # string hashes differ between processes: not the cache
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def micro_batching(workload: WorkloadSpec, kind: str, task: str | None = None) -> int | Batching:
    """The micro-batching of ``kind`` ("inference" or "training"), or of ``task`` where the
    workload's ``task_batching`` sets it apart: its sequence count when it splits by count with
    padding removed (the cost model's formulas as they were), else a :class:`Batching`."""
    training = kind == "training"
    sequences = workload.micro_batch_size if training else workload.inference_micro_batch_size
    tokens = workload.micro_batch_tokens if training else workload.inference_micro_batch_tokens
    remove, pad_to = workload.remove_padding, workload.pad_to
    own = workload.task_batching_of(task) if task is not None else None
    if own is not None:
        if own.micro_batch_tokens is not None:
            tokens = own.micro_batch_tokens
        elif own.micro_batch_size is not None:  # a count of its own replaces a token budget
            sequences, tokens = own.micro_batch_size, None
        remove = own.remove_padding if own.remove_padding is not None else remove
        pad_to = own.pad_to if own.pad_to is not None else pad_to
    padding = "none" if remove else pad_to
    if tokens is None and padding == "none":
        return sequences
    return Batching(sequences, tokens, padding, workload.prompt_length, workload.response_length,
                    workload.responses_per_prompt)


def micro_count(n: float, batching: int | Batching, seq_mean: float,
                load: float = 1.0) -> tuple[int, float]:
    """(micro-batches, sequences per micro-batch) for ``n`` sequences carrying ``load`` x their
    mean tokens ``n seq_mean`` (the slowest replica's excess, :mod:`hetrl.cost.stragglers`)."""
    if isinstance(batching, int):
        count = max(1, math.ceil(n / batching - 1e-9))
    elif batching.tokens is None:
        count = max(1, math.ceil(n / batching.sequences - 1e-9))
    else:
        count = max(1, min(math.ceil(n * seq_mean * load / batching.tokens - 1e-9),
                           math.ceil(n - 1e-9)))
    return count, n / count


def _cdf_full(dist: LengthDist) -> np.ndarray:
    """P(len <= s) for s = 0..max."""
    out = np.zeros(dist.max + 1)
    out[dist.min:] = dist.cdf()
    return out


def _convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.size * b.size <= 4_000_000:
        return np.convolve(a, b)
    from scipy.signal import fftconvolve  # long supports: O(N log N), rounding clipped below
    return np.maximum(fftconvolve(a, b), 0.0)


def longest_moments(prompt: LengthDist, response: LengthDist, group: int,
                    k: int) -> tuple[float, float]:
    """(E[M_k], E[M_k^2]): the longest of ``k`` adjacent sequences whose prompts come in groups
    of ``group`` responses (module docstring)."""
    k = max(int(k), 1)
    g = min(group, k)
    r_cdf = _cdf_full(response) ** g
    r_pmf = np.diff(r_cdf, prepend=0.0)  # the longest of g responses, lengths 0..R_max
    p_pmf = np.zeros(prompt.max + 1)
    p_pmf[prompt.min:] = prompt.pmf()
    pmf = _convolve(p_pmf, r_pmf)  # G = P + max of g R, lengths 0..P_max + R_max
    cdf = np.minimum(np.cumsum(pmf), 1.0)
    cdf[-1] = 1.0
    m_pmf = np.diff(cdf ** (k / g), prepend=0.0)
    s = np.arange(pmf.size, dtype=float)
    return float(s @ m_pmf), float((s * s) @ m_pmf)


class MicroBatcher:
    """One task kind's micro-batches for one workload's lengths (memoised by
    :func:`micro_batcher`): counts, and per-sequence token moments of a micro-batch of k
    sequences (per integer k, memoised). Its methods run per replica priced, so they repeat
    :func:`micro_count`'s arithmetic inline (the same operations, the same numbers)."""

    def __init__(self, batching: Batching, L: LengthStats):
        self.batching, self.L = batching, L
        self.padding = batching.padding
        self.tokens, self.sequences, self.seq_mean = batching.tokens, batching.sequences, L.seq_mean
        longest = float(batching.prompt.max + batching.response.max)
        #: the moments when they do not depend on k (padding removed, or to the longest possible)
        self.fixed = None if self.padding == "longest" else (
            (L.seq_mean, L.seq_sq_mean) if self.padding == "none" else (longest, longest * longest))
        #: per sequence count k: the costed (mean, mean square) tokens per sequence
        self._moments = Table("micro-batch moments", 65_536)
        #: a full micro-batch's sequences and (once priced) its tokens as costed
        self._full: tuple[float, float | None] = (
            float(self.sequences) if self.tokens is None else float(self.tokens) / self.seq_mean,
            None)

    def count(self, n: float, load: float = 1.0) -> tuple[int, float]:
        """:func:`micro_count` of ``n`` sequences at ``load``."""
        if self.tokens is None:
            count = max(1, math.ceil(n / self.sequences - 1e-9))
        else:
            count = max(1, min(math.ceil(n * self.seq_mean * load / self.tokens - 1e-9),
                               math.ceil(n - 1e-9)))
        return count, n / count

    def _at(self, k: int) -> tuple[float, float]:
        b = self.batching
        return self._moments.put(k, longest_moments(b.prompt, b.response, b.group, k))

    def moments(self, k: float) -> tuple[float, float]:
        """(mean, mean square) tokens per sequence of a micro-batch of ``k`` sequences, as it is
        costed: real lengths, padded to its longest, or to the longest possible."""
        if self.fixed is not None:
            return self.fixed
        lo = int(k) if k > 1.0 else 1
        memo = self._moments
        a = memo.get(lo) or self._at(lo)
        frac = k - lo
        if frac < 1e-9:
            return a
        b = memo.get(lo + 1) or self._at(lo + 1)
        return a[0] + frac * (b[0] - a[0]), a[1] + frac * (b[1] - a[1])

    def split(self, n: float, load: float = 1.0) -> tuple[int, float, float, float]:
        """(micro-batches m, sequences x per micro-batch as costed, mean and mean-square tokens
        per sequence) for ``n`` sequences at ``load`` (the inputs of
        :func:`hetrl.cost.kernels.forward_replica_seconds`: tokens = x mean). The load scales the
        real and the longest-padded tokens alike; statically padded tokens do not vary."""
        m, seqs = self.count(n, load)
        mean, sq = self.fixed or self.moments(seqs)
        return m, (seqs if self.padding == "max" else seqs * load), mean, sq

    def memory(self, n: float) -> tuple[float, int]:
        """(tokens one micro-batch holds as costed, micro-batches per optimizer step) of a
        replica with ``n`` sequences, for its activations and logits: by count a full
        micro-batch (or all ``n``), by budget a full budget of real tokens (or all of them)."""
        if self.tokens is None:
            seqs = min(float(self.sequences), max(n, 1.0))
        else:
            seqs = min(float(self.tokens), max(n, 1.0) * self.seq_mean) / self.seq_mean
        if seqs == self._full[0]:  # a full micro-batch: the usual case, priced once
            tokens = self._full[1]
            if tokens is None:
                tokens = seqs * (self.fixed or self.moments(seqs))[0]
                self._full = (seqs, tokens)
        else:
            tokens = seqs * (self.fixed or self.moments(seqs))[0]
        return tokens, self.count(n)[0]


def micro_batcher(batching: Batching, L: LengthStats) -> MicroBatcher:
    """The :class:`MicroBatcher` of ``batching`` for lengths ``L`` (memoised)."""
    key = (batching, L)
    out = BATCHERS.get(key)
    if out is None:
        out = BATCHERS.put(key, MicroBatcher(batching, L))
    return out


def memory_tokens(n: float, batching: int | Batching, L: LengthStats) -> tuple[float, int]:
    """(tokens of one micro-batch, micro-batches) for the memory of a replica with ``n``
    sequences: by count (an int) ``min(mbs, n)`` sequences of mean length and ceil(n / mbs), as
    the cost model always had it; else :meth:`MicroBatcher.memory`."""
    if isinstance(batching, int):
        seqs = min(float(batching), max(n, 1.0))
        return seqs * L.seq_mean, max(1, math.ceil(n / batching))
    return micro_batcher(batching, L).memory(n)
