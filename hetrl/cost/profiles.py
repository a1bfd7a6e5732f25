"""Framework profiles: which RL framework runs the plan, and so which per-step costs it pays
(``framework:`` on a workload; docs/cost-model.md, "Framework profiles").

The per-step framework costs (:data:`hetrl.cost.framework.FRAMEWORK_FIELDS`: per task call,
per token the driver moves, per micro-batch pass, per generated token) are a framework's, not
the GPUs'. Their magnitudes in :class:`~hetrl.cost.params.CostParams` are fitted on verl's fit
step rows (experiments/fit_public.py); a profile says how much of them another framework pays:

- a framework with an RL controller and worker loops (``controller``) pays those costs scaled
  by its ``scale`` -- fitted on its own fit rows where the public set has any
  (``fit_rows``), else 1.0: verl's magnitudes, said so (``fitted`` false);
- a run without an RL controller (a bare Megatron-LM training step, a standalone engine or
  trainer: ``none``) pays none of them.

``CostParams.framework_scale`` overrides a profile's scale (a params file; fit_public's
``profiles`` phase).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from hetrl.cost.framework import FRAMEWORK_FIELDS, without_framework
from hetrl.cost.params import CostParams
from hetrl.spec.workload import FRAMEWORKS


@dataclass(frozen=True)
class FrameworkProfile:
    """One framework's per-step costs relative to the fitted (verl) ones.

    ``controller``: whether the framework has an RL controller and worker loops that pay the
    per-step costs at all. ``scale``: the multiplier on the fitted magnitudes (dimensionless).
    ``fit_rows``: the public set's rows the scale is fitted on (experiments/fit_public.py,
    ``--phase profiles``); empty: not fitted. ``source``: what the profile's structure rests on.
    """

    name: str
    controller: bool
    scale: float
    fit_rows: tuple[str, ...]
    source: str

    @property
    def fitted(self) -> bool:
        """Whether the scale comes from the framework's own fit rows (verl: the base fit)."""
        return bool(self.fit_rows)


FRAMEWORK_PROFILES: dict[str, FrameworkProfile] = {p.name: p for p in (
    FrameworkProfile(
        "verl", True, 1.0, ("S12", "S15", "S16", "S17", "S18"),
        "the per-step costs themselves are fitted on verl's step logs (S12, S15-S18): a Ray "
        "single controller whose DataProto batch passes through the driver on every call"),
    FrameworkProfile(
        "openrlhf", True, 1.0, (),
        "a Ray single controller like verl's (the driver makes the experiences and hands them "
        "to the DeepSpeed actor groups; vLLM engines); no fit rows of its own: its one row "
        "(S5) is holdout, so it pays verl's magnitudes"),
    FrameworkProfile(
        "deepspeed-chat", True, 1.0, (),
        "DeepSpeed-Chat's step 3 (one script per rank: the hybrid engine generates, then the "
        "actor and critic train, every rank its own loop); no fit rows of its own: its rows "
        "(S1-S3, S4) are holdout, so it pays verl's magnitudes (a scale fitted on S1-S3 was "
        "measured and not adopted: docs/cost-model.md, \"Framework profiles\")"),
    FrameworkProfile(
        "nemo-aligner", True, 1.0, (),
        "NeMo-Aligner's PPO: a Megatron actor job with TensorRT-LLM generation and a critic "
        "server reached over PyTriton; no fit rows of its own (S6, S7 are holdout): verl's "
        "magnitudes"),
    FrameworkProfile(
        "nemo-rl", True, 1.0, (),
        "NeMo-RL: a Ray single controller (its BatchedDataDict passes through the driver) "
        "with vLLM generation and Megatron or DTensor training; no fit rows of its own "
        "(S22-S25 are holdout): verl's magnitudes"),
    FrameworkProfile(
        "areal", True, 1.0, (),
        "AReaL: asynchronous rollout workers and trainers under one controller; no fit rows "
        "of its own (S13 publishes only length caps): verl's magnitudes"),
    FrameworkProfile(
        "megatron-lm", False, 0.0, (),
        "a bare Megatron-LM training run (pretrain_gpt.py): no RL controller, no rollout "
        "engine; its per-micro-batch cost is inside the training efficiency fitted on "
        "Megatron-LM's own rows (T1-T3)"),
    FrameworkProfile(
        "none", False, 0.0, (),
        "a standalone engine or trainer (a serving benchmark, a weight-sync test): no RL "
        "controller"),
)}

assert tuple(FRAMEWORK_PROFILES) == FRAMEWORKS, "one profile per framework name"


def framework_scale(params: CostParams, name: str) -> float:
    """The multiplier on ``params``' framework costs that framework ``name`` pays: 0 without an
    RL controller, else ``params.framework_scale``'s entry or the profile's scale."""
    prof = FRAMEWORK_PROFILES[name]
    if not prof.controller:
        return 0.0
    return dict(params.framework_scale).get(name, prof.scale)


@lru_cache(maxsize=256)
def framework_params(params: CostParams, name: str) -> CostParams:
    """``params`` as framework ``name`` pays them: its framework costs scaled (the same object
    for the same arguments, so that the cost model's tables are shared; ``params`` itself when
    the scale is 1)."""
    scale = framework_scale(params, name)
    if scale == 1.0:
        return params
    if scale == 0.0:
        return without_framework(params)
    # scaled once: a second resolution (a cost model built on these params) leaves them be
    done = tuple((n, 1.0) for n, p in FRAMEWORK_PROFILES.items() if p.controller)
    return replace(params, framework_scale=done,
                   **{f: getattr(params, f) * scale for f in FRAMEWORK_FIELDS})
