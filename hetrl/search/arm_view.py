"""What the polish (:mod:`hetrl.search.polish`) and its parts (:mod:`hetrl.search.moves`,
:mod:`hetrl.search.kicks`) see of the arm they work for and of each other: narrow interfaces, so
that the modules import one way (polish -> kicks, moves -> this module) and none imports
:mod:`hetrl.search.ea`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hetrl.search.base import Evaluator
from hetrl.search.genome import Genotype
from hetrl.search.options import PolishOptions
from hetrl.search.space import Layout, aligned
from hetrl.spec.workload import WorkloadSpec


class PolishArm(Protocol):
    """What the polish does with the arm it polishes: read its population and best, price a
    genotype (counted against the arm) or several at once, move a genotype at random, and hand
    back its best."""

    population: list[tuple[float, Genotype]]
    best: float
    evaluations: int

    def fitness(self, ev: Evaluator, g: Genotype) -> float: ...

    def fitness_many(self, ev: Evaluator, gs: Sequence[Genotype]) -> Iterator[float]: ...

    def mutate(self, g: Genotype) -> Genotype: ...

    def adopt(self, state: list) -> None: ...


@dataclass(frozen=True)
class PolishSpace:
    """What the polish reads of an arm's search space (fixed when the arm is made)."""

    workload: WorkloadSpec
    groups: tuple[tuple[str, ...], ...]
    #: per task: the index of its group, and its group's GPU count
    group_of: dict[str, int]
    group_size: dict[str, int]
    #: per task: its full-group layouts, its part-of-group ones, and those by GPUs used
    layout_options: dict[str, Any]
    sub_options: dict[str, tuple[Layout, ...]]
    sub_by_used: dict[str, dict[int, tuple[Layout, ...]]]
    #: per-device keys (:class:`hetrl.search.ea.DeviceFacts`: gpu, node, memory)
    facts: Any
    node_size: int
    training: frozenset[str]
    #: whether the search tries the weight sync's relay
    relay_gene: bool
    #: a task's own bytes per GPU on a layout, and the share of a GPU's memory they may take
    need: Any
    room: float

    def aligned(self, used: int, n: int) -> bool:
        """:func:`hetrl.search.space.aligned` on this arm's node size."""
        return aligned(used, n, self.node_size)


class KickSource(Protocol):
    """What the kicks (:class:`~hetrl.search.kicks.Kicks`) use of their polisher: its arm and
    options, a group's GPUs put in type blocks in another order, a task's type-window runs."""

    arm: PolishArm
    options: PolishOptions

    def type_reordered(self, g: Genotype, turn: int) -> Genotype | None: ...

    def window_runs(self, t: str, base: Genotype) -> Iterator[Any]: ...
