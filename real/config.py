"""What a real run is asked to do besides the plan (:class:`RunConfig`), what it returns
(:class:`RunResult`), and the checks that refuse a run before any worker starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hetrl.errors import require
from hetrl.plan import Plan, validate
from hetrl.spec.cluster import ClusterSpec
from hetrl.spec.workload import WorkloadSpec
from hetrl.trace import Trace
from real.engines import validate_engines
from real.placement import check_supported, tasklets


@dataclass(frozen=True)
class RunConfig:
    """What to run besides the plan. ``kill_at`` = (task, iteration, device) injects a fault:
    that device's worker exits at the start of its tasklet of that task and iteration. Here,
    as in traces, iterations are indexes from 0; messages, the progress line and the command
    line's ``--kill-at`` count them from 1 (iteration 1 is index 0)."""

    iterations: int = 2
    seed: int = 0
    reward: str = "math"
    reward_model_coef: float = 0.0  # final reward = rule reward + coef * reward-model score
    problems: str | None = None  # JSONL of problems; None: the shipped GSM8K-style set
    emulate_network: bool = True
    emulate_speed: bool = True
    device: str = "cpu"
    checkpoint_dir: str | None = None
    resume: bool = False
    kill_at: tuple[str, int, int] | None = None
    lr: float = 1e-3
    kl_coef: float = 0.05
    temperature: float = 1.0
    progress: Callable[[str], None] | None = None
    #: Task kind -> engine name (real.engines.ENGINES); kinds left out use "torch".
    engines: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        require(isinstance(self.iterations, int) and self.iterations >= 1, "iterations",
                self.iterations, "must be an integer >= 1")
        require(self.device in ("cpu", "cuda"), "device", self.device, "must be cpu or cuda")
        require(self.lr > 0, "lr", self.lr, "must be > 0")
        require(self.temperature > 0, "temperature", self.temperature, "must be > 0")
        require(not self.resume or self.checkpoint_dir is not None, "resume", True,
                "needs a checkpoint directory")
        validate_engines(dict(self.engines), self.device)


#: The default of ``RealRun`` and ``run_plan``: two iterations, seed 0, every default above.
DEFAULT_CONFIG = RunConfig()


@dataclass(frozen=True)
class RunResult:
    trace: Trace
    rewards: tuple[float, ...]  # mean final reward per iteration
    stats: tuple[dict[str, float], ...]  # training statistics per iteration
    resumed_from: int | None = None  # first iteration run after a resume
    weights_verified: int = 0  # weight syncs whose digest matched the trainer's

    def iteration_seconds(self) -> list[float]:
        return self.trace.iteration_seconds()


def check_runnable(workload: WorkloadSpec, cluster: ClusterSpec, plan: Plan,
                   config: RunConfig) -> None:
    """Refuse, with one line naming the field, a run this backend cannot do: an invalid plan, a
    layout it does not support, CUDA asked where there is none, models too large for the torch
    CPU backend, a megatron layout megatron-core cannot build, a ``kill_at`` naming no
    tasklet."""
    validate(plan, workload, cluster)
    # before Ray starts: else the run waits for GPU resources no node has
    require(config.device != "cuda" or torch.cuda.is_available(), "device", config.device,
            "no CUDA device is available here (torch.cuda.is_available() is False); "
            "use --device cpu")
    check_supported(plan, workload, dict(config.engines))
    for role, shape in workload.models:
        require(shape.params <= 50_000_000, f"models.{role}", shape.name,
                f"has {shape.params:,} parameters; the torch CPU backend runs models of at "
                "most 50M (use tiny-qwen3 or a shape of that size)")
        require(shape.vocab >= 259, f"models.{role}.vocab", shape.vocab,
                "must be >= 259 (the byte tokenizer's vocabulary)")
    if dict(config.engines).get("training") == "megatron":
        from real.engines.megatron_engine import import_megatron

        import_megatron()  # before Ray starts: says how to install it
    if config.kill_at is not None:
        task, it, device = config.kill_at
        places = sorted({(t.task, t.device) for t in tasklets(plan, workload)})
        require((task, device) in places and 0 <= it < config.iterations, "kill_at",
                config.kill_at, f"must name a (task, device) of the plan, one of {places}, "
                f"and an iteration in [0, {config.iterations})")
