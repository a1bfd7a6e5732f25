"""What the cost model answers: an :class:`Estimate` per plan (with its :class:`MemoryReport`),
and the :class:`TaskResult` of one task inside it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class MemoryReport:
    """Per-device memory of a plan's task groups, turned into GB and messages only when read
    (a search makes estimates by the hundred thousand and reads these of one or two).

    ``peaks``: per group, its device ids and the bytes per device at peak (indexed by device id);
    ``over``: per group whose devices exceed their usable memory, those device ids and a (6, k)
    array of their needed, weight, trained-state, working and usable bytes and the bytes a
    sleeping rollout engine's weights add while it generates; ``gpus``: per device of the
    cluster, its GPU type name and memory (GB: the driver's total, ``GPUType.memory_bytes``)."""

    peaks: tuple[tuple[np.ndarray, np.ndarray], ...]
    over: tuple[tuple[np.ndarray, np.ndarray], ...]
    gpus: tuple[tuple[str, float], ...]
    #: per group the rows of its memory kernel (:data:`~hetrl.cost.kernels.GROUP_MEMORY_ROWS`,
    #: bytes over all devices) and the KV pool its rollout engine allocates (None: no rollout)
    terms: tuple[tuple[np.ndarray, np.ndarray | None], ...]
    #: usable bytes per device (memory x usable_memory_fraction)
    usable: np.ndarray

    def peak_gb(self) -> dict[int, float]:
        """Device id -> peak GB (1e9 bytes), in device order."""
        ids = np.concatenate([i for i, _ in self.peaks])
        gb = np.concatenate([b[i] for i, b in self.peaks]) / 1e9
        order = np.argsort(ids, kind="stable")
        return dict(zip(ids[order].tolist(), gb[order].tolist(), strict=True))

    def breakdown(self) -> dict[int, dict[str, Any]]:
        """Device id -> its memory terms in GB (1e9 bytes), in device order: ``weights`` (model
        copies resident throughout), ``states`` (gradients and optimizer states),
        ``working`` (the largest working set), ``rollout_weights`` (a sleeping rollout's
        weights, on the GPU while it generates), ``kv_pool`` (the KV cache its rollout engine
        allocates there), ``need`` (what the plan needs outside the KV cache), ``peak``,
        ``usable`` and ``over`` (need - usable when positive)."""
        peaks = self.peak_gb()
        out = {}
        for ((ids, _), (rows, kv_pool)) in zip(self.peaks, self.terms, strict=True):
            for d in ids.tolist():
                # (rows in the order of hetrl.cost.kernels.GROUP_MEMORY_ROWS)
                gb = {name: float(rows[i, d]) / 1e9 for i, name in
                      ((1, "weights"), (2, "states"), (3, "working"), (9, "rollout_weights"),
                       (0, "need"))}
                generates = kv_pool is not None and rows[8, d] > 0
                usable = float(self.usable[d]) / 1e9
                out[d] = {"gpu": self.gpus[d][0], "memory": self.gpus[d][1], **gb,
                          "kv_pool": max(float(kv_pool[d]), 0.0) / 1e9 if generates else 0.0,
                          "peak": peaks[d], "usable": usable,
                          "over": max(gb["need"] - usable, 0.0)}
        return dict(sorted(out.items()))

    def messages(self) -> tuple[str, ...]:
        """One message per device over its usable memory, in device order."""
        rows = sorted((d, *col) for ids, table in self.over
                      for d, col in zip(ids.tolist(), table.T.tolist(), strict=True))
        out = []
        for d, need, weights, states, working, usable, rollout in rows:
            name, memory_gb = self.gpus[d]
            phases = f"working {working / 1e9:.1f}"
            if rollout > 0:  # the larger of the other tasks' working sets and the rollout's phase
                phases = (f"then the larger of working {working / 1e9:.1f} and the sleeping "
                          f"rollout's weights {rollout / 1e9:.1f} while it generates")
            out.append(
                f"device {d} ({name}): needs {need / 1e9:.1f} GB (weights {weights / 1e9:.1f}, "
                f"grads+optimizer {states / 1e9:.1f}, {phases}) > usable {usable / 1e9:.1f} GB "
                f"of {memory_gb:.1f} GB, over by {(need - usable) / 1e9:.1f} GB")
        return tuple(out)


@dataclass(frozen=True, eq=False)
class Estimate:
    """The cost model's answer for one plan. Times in seconds, memory in GB (1e9 bytes).
    ``peak_memory_gb`` (device id -> GB) and ``violations`` (memory messages in device order,
    then the tasks' own) are built from ``memory`` and ``task_violations`` when first read.
    Estimates compare by :meth:`to_dict`."""

    iteration_s: float
    tasks: dict[str, float]
    parts: dict[str, dict[str, float]]
    feasible: bool
    samples_per_iteration: int
    tokens_per_iteration: float
    chain_s: float
    generation_concurrency: int
    memory: MemoryReport
    task_violations: tuple[str, ...] = ()
    #: the generation task's (prefill seconds, decode seconds, decode steps), its slowest replica
    #: (what ``hetrl calibrate`` compares with a trace's phase spans; not in :meth:`to_dict`)
    generation_phases: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @cached_property
    def peak_memory_gb(self) -> dict[int, float]:
        return self.memory.peak_gb()

    @cached_property
    def violations(self) -> tuple[str, ...]:
        return self.memory.messages() + self.task_violations

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Estimate) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    @property
    def throughput_samples_per_s(self) -> float:
        return self.samples_per_iteration / self.iteration_s

    @property
    def throughput_tokens_per_s(self) -> float:
        return self.tokens_per_iteration / self.iteration_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration_s": self.iteration_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "feasible": self.feasible,
            "violations": list(self.violations),
            "peak_memory_gb": {str(d): gb for d, gb in self.peak_memory_gb.items()},
            "memory_gb": {str(d): terms for d, terms in self.memory.breakdown().items()},
            "tasks": dict(self.tasks),
            "parts": {t: dict(p) for t, p in self.parts.items()},
            "chain_s": self.chain_s,
            "generation_concurrency": self.generation_concurrency,
        }


@dataclass(slots=True)
class TaskResult:
    """One task's seconds, its parts (seconds by kind: see ``tasks.PARTS``), its violations
    and (generation) the concurrency it decodes at."""

    seconds: float
    parts: dict[str, float]
    violations: tuple[str, ...]
    concurrency: int = 0
    #: generation: (prefill seconds, decode seconds, decode steps) of the slowest replica
    phases: tuple[float, float, float] = (0.0, 0.0, 0.0)
