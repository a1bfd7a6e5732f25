"""A run's checkpoint: ``checkpoint.pt`` in the checkpoint directory, written atomically after
every iteration. It holds the trainers' weights and Adam states (device -> task -> state), the
finished iterations' spans, boundaries, rewards and statistics, the count of verified weight
syncs, and the run's identity (what a resuming run must share with it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hetrl.errors import SpecError
from hetrl.trace import Span

CHECKPOINT = "checkpoint.pt"


@dataclass
class RunState:
    """What survives an interruption: finished iterations' spans, rewards and stats."""

    next_iteration: int = 0
    spans: list[Span] = field(default_factory=list)
    iterations: list[tuple[float, float]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    stats: list[dict[str, float]] = field(default_factory=list)
    verified: int = 0  # weight syncs whose digest matched the trainer's


def save_checkpoint(ckpt: Path, state: RunState, trainers: dict[int, dict[str, Any]],
                    identity: dict[str, Any]) -> None:
    """Write ``ckpt/checkpoint.pt`` atomically; an OS error is one line naming the folder."""
    tmp = ckpt / f".{CHECKPOINT}.{os.getpid()}.tmp"
    try:
        ckpt.mkdir(parents=True, exist_ok=True)
        torch.save({"next_iteration": state.next_iteration, "trainers": trainers,
                    "spans": [s.to_dict() for s in state.spans],
                    "iterations": state.iterations, "rewards": state.rewards,
                    "stats": state.stats, "verified": state.verified,
                    "run": identity}, tmp)
        os.replace(tmp, ckpt / CHECKPOINT)
    except OSError as exc:  # a full disk, a folder made read-only meanwhile: one line
        tmp.unlink(missing_ok=True)
        raise SpecError("checkpoint_dir", str(ckpt),
                        f"cannot write the checkpoint: {exc.strerror or exc}") from None


def load_checkpoint(ckpt: Path, identity: dict[str, Any]
                    ) -> tuple[RunState, dict[int, dict[str, Any]]]:
    """The state and trainer states in ``ckpt``, refused unless it was written by a run of the
    same ``identity``."""
    path = ckpt / CHECKPOINT
    if not path.exists():
        raise SpecError("resume", str(path), "no checkpoint there to resume from")
    data = torch.load(path, weights_only=False)
    for key, value in (data.get("run") or {}).items():
        if identity.get(key) != value:
            raise SpecError("resume", str(path), f"the checkpoint was written by a run with "
                            f"another {key}; resume with the same {key}")
    state = RunState(data["next_iteration"], [Span.from_dict(s) for s in data["spans"]],
                     [tuple(x) for x in data["iterations"]], list(data["rewards"]),
                     list(data["stats"]), int(data.get("verified", 0)))
    return state, data["trainers"]
