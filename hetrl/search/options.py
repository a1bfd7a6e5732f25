"""Typed, validated options of the schedulers (as Optuna's samplers take theirs: keyword-only,
documented, a misspelled option is an error, never silently ignored).

Each scheduler declares an ``Options`` frozen dataclass; :func:`parse_options` builds it from the
keyword arguments of ``get_scheduler(name, **options)``, checking every name and type. Numbers
are checked for range in each dataclass's ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

from hetrl.errors import SpecError, require
from hetrl.plan import Plan


def parse_options(cls: type, scheduler: str, given: dict[str, Any]) -> Any:
    """``cls(**given)`` after checking that every key is one of its fields and every value has
    the field's type (booleans are not integers; integers are accepted where a float is)."""
    if hasattr(cls, "from_flat"):  # nested options given as flat keywords
        return cls.from_flat(scheduler, **given)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in given.items():
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise SpecError(f"{scheduler} option", key, f"unknown; known: {known}")
        _check_type(f"{scheduler} option {key}", value, hints[key])
    return cls(**given)


def _check_type(name: str, value: Any, hint: Any) -> None:
    args = typing.get_args(hint)
    if type(None) in args:  # Optional[X]
        if value is None:
            return
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value))
    else:
        ok = True  # plain data (e.g. a plan given as a hint): the scheduler checks it
    require(ok, name, value, f"must be {getattr(hint, '__name__', hint)}")


def _fraction(name: str, value: float, top: float = 1.0) -> None:
    require(0.0 <= value <= top, name, value, f"must be in [0, {top}]")


@dataclass(frozen=True, kw_only=True)
class NoOptions:
    """A scheduler without options."""


@dataclass(frozen=True, kw_only=True)
class FlatOptions:
    """``random`` and ``deap``: their plans decoded with or without the load balancer."""

    #: decode plans with the load balancer (data shares and layer splits from speeds)
    load_balance: bool = True


@dataclass(frozen=True, kw_only=True)
class DeapOptions(FlatOptions):
    """``deap``: eaSimple's parameters (DEAP's documented defaults for a GA of this size)."""

    #: individuals per generation
    population: int = 32
    #: probability that a selected pair is mated (two-point crossover)
    cxpb: float = 0.5
    #: probability that an individual is mutated (polynomial bounded)
    mutpb: float = 0.2

    def __post_init__(self) -> None:
        require(self.population >= 2, "deap option population", self.population, "must be >= 2")
        _fraction("deap option cxpb", self.cxpb)
        _fraction("deap option mutpb", self.mutpb)


@dataclass(frozen=True, kw_only=True)
class ILPOptions(FlatOptions):
    """``ilp``: its candidates priced with or without the load balancer (``load_balance``)."""

    #: the phased solve where the workflow's stages are barriers (PPO, GRPO sync); False: the
    #: monolithic model alone
    phased: bool = True
    #: a plan to start the solver from (CP-SAT's hint)
    hint: Plan | None = None


@dataclass(frozen=True, kw_only=True)
class VerlOptions:
    """``verl`` and ``verl-async``: how a verl user picks a configuration."""

    #: the believed-best configurations a user measures on the real cluster, keeping the fastest
    #: (configurations that do not fit in memory are skipped and do not count)
    k_best: int = 5

    def __post_init__(self) -> None:
        require(self.k_best >= 1, "verl option k_best", self.k_best, "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class WarmStartOptions:
    """SHA-EA's warm start (our addition): the plans of the cheap heuristics the space contains
    (all co-located, only the fastest GPU type, only the best-connected region, verl's,
    verl-async's and StreamRL's pool structures), tuned and kept as a floor."""

    #: share of the evaluation budget the warm start may use (pricing its starts, tuning)
    warm_fraction: float = 0.25
    #: at most this many of the best-priced warm starts are tuned (coordinate descent over
    #: layouts, successive halving over them; fewer where the budget affords fewer sweeps)
    warm_tuned: int = 8
    #: and this many more of the infeasible starts (the fastest had they fitted) take the
    #: tuning's first step, generation's layout: its rule-of-thumb layout is what overflows
    #: memory most often, and an infeasible start ranks after every feasible one
    warm_repaired: int = 2

    def __post_init__(self) -> None:
        _fraction("hetrl option warm_fraction", self.warm_fraction)
        _at_least("warm_tuned", self.warm_tuned, 0)
        _at_least("warm_repaired", self.warm_repaired, 0)


@dataclass(frozen=True, kw_only=True)
class HalvingOptions:
    """SHA-EA's nested successive halving (levels 1-2) and its final phase."""

    #: price every task grouping's structured first individual before any EA step, and let
    #: the best-priced groupings (not a random subset) enter the halving when the budget
    #: cannot afford them all
    screening: bool = True
    #: share of the evaluation budget screening may use (beyond it, a subset is screened)
    screening_fraction: float = 0.2
    #: share of the budget (after warm start and screening) kept for the final phase
    exploit_fraction: float = 0.7
    #: GPU-group size vectors per task grouping (level-2 arms); None: adaptive to the budget
    gpu_groupings: int | None = None
    #: level-2 arms whose sizes sum to fewer than all GPUs (the rest idle): one per
    #: grouping with the GPUs of the fastest types first, when the budget allows two arms
    idle_sizes: bool = True
    #: the best arm of the all-co-located grouping joins the finalists
    colocated_finalist: bool = True
    #: after each turn of the final round robin, drop the worse half of the finalists
    final_halving: bool = True
    #: before the final phase, the best plan so far joins the co-located arm on all GPUs (as
    #: one group, the same placements), whose polish then starts from it
    carry_best: bool = True

    def __post_init__(self) -> None:
        _fraction("hetrl option screening_fraction", self.screening_fraction)
        _fraction("hetrl option exploit_fraction", self.exploit_fraction, 0.95)
        if self.gpu_groupings is not None:
            _at_least("gpu_groupings", self.gpu_groupings, 1)


@dataclass(frozen=True, kw_only=True)
class PolishOptions:
    """SHA-EA's polish of the finalists (coordinate descent on levels 4-5, our addition;
    hetrl/search/polish.py, docs/search.md)."""

    #: a polish pass begins with one sweep over each task's full-group layouts (cheap), so a
    #: pass cut short by a small budget has tuned every task before the costly splits
    quick_sweep: bool = True
    #: the polish's pair splits: from how many of the best split mixes one sweep starts
    split_starts: int = 2
    #: greedy sweeps over the other tasks' options from each split start
    split_sweeps: int = 1
    #: a pass starts from each group's GPUs in blocks of one type
    type_blocks: bool = True
    #: at most this many turns of a split: each task of the pair (triple) in turn takes its
    #: best layout on its window given the others', until a fixed point (at least 2 (3))
    split_turns: int = 6
    #: iterated local search: a converged pass restarts from the best after this many moves
    #: (0: no further passes)
    kick_moves: int = 3
    #: kicks also reorder each group's type blocks (the next order of its GPU types not yet
    #: tried), taking turns with the other kinds of kick
    kick_orders: bool = True
    #: kicks also move one task onto a type window of its group (the best-priced such move
    #: not yet tried), taking turns with the other kinds of kick
    kick_windows: bool = True
    #: also split independent triples of a group's tasks (PPO's reward, reference and critic
    #: inference) over three windows
    split_triples: bool = True
    #: successive halving over a split's (shape, offset) candidates, turns as the resource
    split_halving: bool = True
    #: pair splits with a training task start from the other tasks' least-memory options
    split_light: bool = True
    #: sweeps start from the best split of each mix (window sizes and GPU types per task)
    split_mixes: bool = True
    #: price every split as built first, and turn only this many best-priced splits of each
    #: task set, the task sets in order of their best-priced split (0: every split turns,
    #: the task sets in their own order)
    split_screen: int = 16
    #: with the splits' screen, each task alone on each type window of its group (each GPU
    #: type's GPUs, and all but one type's) priced on a first guess, and this many
    #: best-priced windows of each task turn over its layouts there (0: no type windows)
    window_screen: int = 2
    #: a task's moves in the sweeps and coordinate passes: each of its windows priced once on
    #: a first guess, then this many best-priced windows (and its own) over all their layouts
    #: (0: every (layout, offset) option priced)
    sweep_screen: int = 3
    #: hold a finalist's polish back until its EA went this many evaluations without a gain
    stall_steps: int = 0
    #: a polish call's cap is a third of the budget divided by this
    polish_chunks: int = 1

    def __post_init__(self) -> None:
        for name, low in (("split_starts", 1), ("split_sweeps", 0), ("split_turns", 2),
                          ("kick_moves", 0), ("stall_steps", 0), ("polish_chunks", 1),
                          ("split_screen", 0), ("window_screen", 0), ("sweep_screen", 0)):
            _at_least(name, getattr(self, name), low)


def _at_least(name: str, value: int, low: int) -> None:
    require(value >= low, f"hetrl option {name}", value, f"must be >= {low}")


#: the nested options' flat keywords (``get_scheduler("hetrl", stall_steps=3)``), by group
_GROUPS = {"warm_start": WarmStartOptions, "halving": HalvingOptions, "polish": PolishOptions}


@dataclass(frozen=True, kw_only=True)
class SHAOptions:
    """``hetrl`` and ``hetrl-simple``: SHA-EA's options (docs/search.md says what each does and
    docs/search-history.md why each default is what it is). The warm start, the halving and the
    polish have their own options; ``warm_start=None`` and ``polish=None`` are the ablations.
    :meth:`from_flat` takes every option as one keyword (what ``get_scheduler`` passes)."""

    #: our additions around the paper's halving (None: no warm start, the ablation)
    warm_start: WarmStartOptions | None = WarmStartOptions()
    #: the paper's nested successive halving and our final phase
    halving: HalvingOptions = HalvingOptions()
    #: polish the finalists (None: no polish)
    polish: PolishOptions | None = PolishOptions()

    # --- the evolutionary algorithm (levels 3-5) ---
    #: individuals per arm
    population: int = 8
    #: decode plans with the load balancer (the ablation: False)
    load_balance: bool = True
    #: probability that a mutation swaps a training GPU for a stronger one no training group uses
    p_upgrade: float = 0.3
    #: part-of-group layouts (dp * pp * tp at most half the group, aligned) in the space
    sub_layouts: bool = True
    #: share of layout mutations that draw a part-of-group layout (GPUs of the group idle for
    #: that task)
    p_sub: float = 0.15
    #: probability that a mutation flips the plan's ``sync_relay`` (the weight sync's one copy
    #: per remote region); the tuning sweeps and polish passes also try the flip once each.
    #: Only on clusters of two or more regions (elsewhere the relay changes nothing); 0: the
    #: search never tries the relay
    p_relay: float = 0.05

    def __post_init__(self) -> None:
        for name in ("p_upgrade", "p_sub", "p_relay"):
            _fraction(f"hetrl option {name}", getattr(self, name))
        _at_least("population", self.population, 2)
        for name, cls in _GROUPS.items():
            value = getattr(self, name)
            require(isinstance(value, cls) or (value is None and name != "halving"),
                    f"hetrl option {name}", value,
                    f"must be {cls.__name__}" + (" or None" if name != "halving" else ""))

    @classmethod
    def from_flat(cls, scheduler: str = "hetrl", **given: Any) -> SHAOptions:
        """The options from flat keywords: every field of the nested options by its own name,
        and ``warm_start`` and ``polish`` as booleans (or the nested options). Refuses, naming
        both, an option that does nothing with another given: a polish or warm-start option
        with ``polish=False`` / ``warm_start=False``, ``screening_fraction`` with
        ``screening=False``, ``p_sub`` with ``sub_layouts=False``, ``window_screen`` with
        ``split_screen=0``, ``kick_orders=True`` or ``kick_windows=True`` with ``kick_moves=0``."""
        top = {f.name: f for f in dataclasses.fields(cls)}
        owner = {f.name: group for group, sub in _GROUPS.items()
                 for f in dataclasses.fields(sub)}
        known = ", ".join(sorted(set(top) | set(owner)))
        nested: dict[str, dict[str, Any]] = {group: {} for group in _GROUPS}
        flat: dict[str, Any] = {}
        for key, value in given.items():
            if key in owner:
                _check_type(f"{scheduler} option {key}", value,
                            typing.get_type_hints(_GROUPS[owner[key]])[key])
                nested[owner[key]][key] = value
            elif key in _GROUPS:
                if isinstance(value, bool) and key != "halving":
                    flat[key] = value
                else:
                    require(isinstance(value, _GROUPS[key]) or (value is None and key != "halving"),
                            f"{scheduler} option {key}", value,
                            "must be bool" if key != "halving" else "must be HalvingOptions")
                    flat[key] = value
            elif key in top:
                _check_type(f"{scheduler} option {key}", value, typing.get_type_hints(cls)[key])
                flat[key] = value
            else:
                raise SpecError(f"{scheduler} option", key, f"unknown; known: {known}")
        _no_effect(scheduler, given, "polish", False, nested["polish"])
        _no_effect(scheduler, given, "warm_start", False, nested["warm_start"])
        _no_effect(scheduler, given, "screening", False,
                   {k: v for k, v in nested["halving"].items() if k == "screening_fraction"})
        _no_effect(scheduler, given, "sub_layouts", False,
                   {k: v for k, v in given.items() if k == "p_sub"})
        _no_effect(scheduler, given, "split_screen", 0,  # the windows are screened with the splits
                   {k: v for k, v in nested["polish"].items() if k == "window_screen" and v})
        _no_effect(scheduler, given, "kick_moves", 0,  # no kicks at all
                   {k: v for k, v in nested["polish"].items()
                    if k in ("kick_orders", "kick_windows") and v})
        for group in _GROUPS:
            value = flat.get(group, True)
            if value is True:
                value = getattr(cls, group)  # the default options
            elif value is False:
                value = None
            if nested[group]:  # (value is not None: _no_effect refused that)
                value = dataclasses.replace(value, **nested[group])
            flat[group] = value
        return cls(**flat)


def _no_effect(scheduler: str, given: dict[str, Any], switch: str, off: Any,
               options: dict[str, Any]) -> None:
    """Refuse ``options`` given with ``switch`` set to ``off`` (they would do nothing)."""
    if options and switch in given and given[switch] in (off, None):
        name = next(iter(options))
        raise SpecError(f"{scheduler} option {name}", options[name],
                        f"does nothing with {switch}={given[switch]!r}")
