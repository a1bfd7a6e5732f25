"""What a search minimises and the limits its plan must keep (``hetrl plan --objective``,
``--max-dollars-per-hour``, ``--deadline-s``, ``--charge-used-only``; docs/money.md).

The fitness of a plan the cost model says fits in memory:

- objective ``time``: its seconds per iteration; ``cost``: its dollars per 1,000 samples
  (:mod:`hetrl.cost.money`: GPU-hours at on-demand prices plus egress);
- a plan over a limit ranks after every plan within them and before every plan that does not
  fit: ``CONSTRAINT_PENALTY + 1000 x v`` where v is the relative excess summed over the limits
  ((dollars per hour - cap) / cap, (seconds per iteration - deadline) / deadline), capped at
  100 so that the ranking stays under the memory penalty.

Schedulers that search by their own published objective (the baselines) take only ``time``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetrl.errors import InfeasibleError, SpecError, finite_number, one_of

OBJECTIVES = ("time", "cost")
#: Fitness of a plan over a limit: above any plan's seconds or $/1k samples, below the memory
#: penalty (hetrl.search.base.INFEASIBLE_PENALTY_S = 1e6).
CONSTRAINT_PENALTY = 1e5
#: Largest --max-dollars-per-hour and --deadline-s accepted.
MAX_DOLLARS_PER_HOUR = 1e7
MAX_DEADLINE_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class Objective:
    """``kind``: time or cost; ``max_dollars_per_hour`` and ``deadline_s`` (seconds per
    iteration): limits, None for none; ``charge_used_only``: a plan pays only for the GPUs it
    uses (default: every GPU of the cluster, idle ones too)."""

    kind: str = "time"
    max_dollars_per_hour: float | None = None
    deadline_s: float | None = None
    charge_used_only: bool = False

    def __post_init__(self) -> None:
        one_of("--objective", self.kind, OBJECTIVES)
        if self.max_dollars_per_hour is not None:
            v = finite_number("--max-dollars-per-hour", self.max_dollars_per_hour, 0.0,
                              MAX_DOLLARS_PER_HOUR, "dollars per hour")
            if v <= 0:
                raise SpecError("--max-dollars-per-hour", v, "must be > 0")
        if self.deadline_s is not None:
            v = finite_number("--deadline-s", self.deadline_s, 0.0, MAX_DEADLINE_S,
                              "seconds per iteration")
            if v <= 0:
                raise SpecError("--deadline-s", v, "must be > 0")

    @property
    def is_plain_time(self) -> bool:
        """Seconds per iteration and no limits: the fitness every scheduler had before."""
        return self.kind == "time" and self.max_dollars_per_hour is None \
            and self.deadline_s is None

    @property
    def needs_money(self) -> bool:
        return self.kind == "cost" or self.max_dollars_per_hour is not None

    def limits(self) -> str:
        """The limits in words, as the flags that set them."""
        out = []
        if self.max_dollars_per_hour is not None:
            out.append(f"--max-dollars-per-hour {self.max_dollars_per_hour:g}")
        if self.deadline_s is not None:
            out.append(f"--deadline-s {self.deadline_s:g}")
        return " and ".join(out)

    def check(self, cluster: Any) -> None:
        """Refuse (exit 2) what no plan can meet before searching: a GPU type without a price
        when dollars are needed; a cap below the whole cluster's hourly price when idle GPUs
        are charged."""
        if not self.needs_money:
            return
        from hetrl.cost.money import hourly_gpu_dollars

        hourly, missing = hourly_gpu_dollars(cluster)
        if missing:
            raise SpecError("prices.gpu_hour", missing,
                            "no price for these GPU types of the cluster (--objective cost and "
                            "--max-dollars-per-hour need one): give prices.gpu_hour in the "
                            "cluster file")
        cap = self.max_dollars_per_hour
        if cap is not None and not self.charge_used_only and hourly > cap:
            raise InfeasibleError(
                f"--max-dollars-per-hour {cap:g}: infeasible: the cluster's "
                f"{cluster.num_devices} GPUs cost ${hourly:,.2f}/h when idle GPUs are charged; "
                f"raise the cap or add --charge-used-only (a plan pays only for the GPUs it uses)")

    def money(self, model: Any, plan: Any, est: Any) -> Any:
        from hetrl.cost.money import money

        return money(model, plan, est.iteration_s, self.charge_used_only)

    def excess(self, est: Any, money: Any) -> float:
        """Relative excess over the limits (0: within them)."""
        v = 0.0
        cap = self.max_dollars_per_hour
        if cap is not None:
            v += max(money.dollars_per_hour - cap, 0.0) / cap
        if self.deadline_s is not None:
            v += max(est.iteration_s - self.deadline_s, 0.0) / self.deadline_s
        return v

    def fitness(self, model: Any, plan: Any, est: Any) -> float:
        """The fitness of a plan that fits in memory (see the module docstring)."""
        if self.is_plain_time:
            return est.iteration_s
        m = self.money(model, plan, est) if self.needs_money else None
        v = self.excess(est, m)
        if v > 0:
            return CONSTRAINT_PENALTY + 1000.0 * min(v, 100.0)
        return est.iteration_s if self.kind == "time" else m.dollars_per_1k_samples

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.kind, "max_dollars_per_hour": self.max_dollars_per_hour,
                "deadline_s": self.deadline_s, "charge_used_only": self.charge_used_only}


TIME = Objective()
