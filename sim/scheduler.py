"""One generation replica's scheduler as vLLM runs it (the V1 engine's policy): continuous
batching with the KV cache allocated on demand, prompts admitted while they fit, chunked prefill
mixed into the running batch's decode steps, and preemption by recompute when the cache runs
out (docs/simulator.md, "Generation").

- **Admission.** While fewer than ``max_seqs`` (``max_num_seqs``) run, the queue's head is
  admitted if the cache holds its prompt (and, for a preempted sequence, what it had generated:
  recompute prefills both again). Nothing is admitted in a step that preempted (vLLM's rule).
- **Prefill.** Prompts admitted into an idle replica are prefilled on their own
  (:meth:`~sim.ops.ReplicaOps.prefill`); prompts admitted while others decode join the next
  decode steps' token budget (:meth:`~sim.ops.ReplicaOps.decode_mixed`).
- **Decode.** Every step each running sequence writes one token of KV. The batch runs until its
  next sequence ends or until the cache would overflow, whichever is first.
- **Preemption.** When the next step's tokens do not fit, the latest admitted sequences are
  preempted (their cache freed, back to the queue's head with the tokens they generated) until
  they do; a lone sequence is never preempted (the cost model flags a budget below one
  sequence as a violation).

The cache is counted in tokens (``capacity_tokens``: the replica's smallest stage budget over
its KV bytes per token); vLLM's 16-token blocks are not modelled.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from sim.ops import NO_PREFILL, PrefillWork, ReplicaOps


@dataclass
class GenerationStats:
    """What one replica's generation did: decode steps, the largest batch, preemptions and the
    prompt tokens prefilled (recomputed ones included)."""

    steps: int = 0
    peak_batch: int = 0
    preemptions: int = 0
    prompt_tokens: float = 0.0


def generate(ops: ReplicaOps, prompts: np.ndarray, responses: np.ndarray, max_seqs: int,
             capacity_tokens: float, stats: GenerationStats) -> Iterator[tuple[float, bool]]:
    """Yield (seconds before any slowdown, whether it is a separate prefill) for each piece of
    one replica's generation of the sequences with lengths ``prompts`` and ``responses``
    (tokens), in the order given, filling ``stats`` as it goes."""
    prompt = [int(x) for x in prompts]
    response = [int(x) for x in responses]
    queue: deque[tuple[int, int]] = deque((s, 0) for s in range(len(prompt)))  # (seq, generated)
    finish: dict[int, int] = {}  # running sequence -> the step it ends at
    heap: list[tuple[int, int]] = []  # (finish step, sequence); stale entries skipped
    admitted: list[int] = []  # running sequences in admission order (latest last)
    used = 0  # KV tokens held: prompt + generated of every running sequence
    step = 0
    pending = NO_PREFILL
    preempted = False
    while queue or finish:
        if not preempted:
            work = NO_PREFILL
            idle = not finish
            while queue and len(finish) < max_seqs:
                s, done = queue[0]
                need = prompt[s] + done
                if finish and used + need > capacity_tokens:
                    break
                queue.popleft()
                used += need
                finish[s] = step + response[s] - done
                heapq.heappush(heap, (finish[s], s))
                admitted.append(s)
                work = work.plus(PrefillWork(float(need), float(need * need), 1.0))
                stats.prompt_tokens += need
            if work.tokens > 0:
                if idle:
                    yield ops.prefill(work.tokens, work.sq_sum, int(work.prompts)), True
                else:
                    pending = pending.plus(work)
        preempted = False
        b = len(finish)
        stats.peak_batch = max(stats.peak_batch, b)
        while heap and finish.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        k = heap[0][0] - step
        room = capacity_tokens - used
        if room < b and b > 1:  # the next step's tokens do not fit: preempt the latest
            while b > 1 and capacity_tokens - used < b:
                s = admitted.pop()
                if s not in finish:
                    continue
                done = response[s] - (finish.pop(s) - step)
                used -= prompt[s] + done
                queue.appendleft((s, done))
                stats.preemptions += 1
                b -= 1
            preempted = True
            continue
        if b > 1 and math.isfinite(room):
            k = min(k, int(room // b))
        dt, left = ops.decode_mixed(b, used + b, k, pending)  # step i attends used + (i+1) b
        pending = left or NO_PREFILL
        stats.steps += k
        yield dt, False
        step += k
        used += b * k
        while heap and heap[0][0] == step:
            _, s = heapq.heappop(heap)
            if finish.get(s) == step:
                del finish[s]
                used -= prompt[s] + response[s]
        if len(admitted) > 2 * len(finish) + 64:  # drop finished entries now and then
            admitted = [s for s in admitted if s in finish]
