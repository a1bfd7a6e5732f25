"""A training task's (dp, pp, tp) device grid as megatron-core process groups, and the tensor-
parallel slicing of weights between one full (Hugging Face) copy and the shard a rank holds.

A plan places a training task's replica r, stage s, tensor rank t on ``devices[r][s][t]``.
Megatron's groups over that grid, with the same meaning as ``parallel_state``'s:

=========== ====================================== ==============================
group       members                                used by
=========== ====================================== ==============================
``tp``      the tp ranks of one (replica, stage)   column / row parallel linears
``pp``      one tp rank's stages of one replica    the 1F1B schedule's p2p
``dp``      one (stage, tp rank) over the replicas gradient reduce-scatter,
                                                   parameter all-gather
``mp``      every rank of one replica              the optimizer's model-parallel
                                                   rank
``embd``    first and last stage (per tp rank)     tied embeddings (unused: the
                                                   head is untied, as Qwen3's)
``pos_embd`` first stage (per tp rank)             learned positions (unused: RoPE)
``cp``      the rank alone                         context parallel size 1
``all``     every rank of the task                 the distributed optimizer's
                                                   gradient norm (one instance)
``ep``      one (stage, tp rank) of ``ep``          the MoE token dispatcher's
            consecutive replicas                   all-to-all
``tp_ep``   the tp ranks of those replicas         expert-parallel bookkeeping
``tp_ep_pp`` every rank of those replicas          the experts' gradient norm
``expt_dp`` one (stage, tp rank) of the replicas   the experts' gradient reduce and
            holding the same experts (i, i + ep)   optimizer shards
``tp_dp_cp`` every rank of one stage               the MoE router's token counts
=========== ====================================== ==============================

``tp_dp_cp`` exists for a mixture-of-experts model (``moe``), the other expert groups only with
expert parallelism (``ep`` > 1);
experts are split over tp as the dense MLP is (Megatron's default expert tensor parallel size,
the tp size). Without them the expert groups are the dense ones (ep the rank alone).

Groups are named ``{task}/megatron/{kind}/{index}`` and listed by :meth:`MegatronGrid.groups`
as device tuples, each in the order of the grid (group rank i is position i); every process of
the torch.distributed world must create every group, in the same order (:func:`create_groups`),
members or not. megatron-core is imported inside functions only.

Shards: column-parallel weights (``linear_qkv``, ``linear_fc1``, the vocabulary-parallel
embedding and output layer) are split along rows, row-parallel ones (``linear_proj``,
``linear_fc2``) along columns; ``linear_fc1`` keeps gate and up apart (rank t holds gate rows
t, then up rows t, as Megatron's SwiGLU chunks its local output in two); norms and the value
head are whole on every rank. The vocabulary is padded with zero rows to a multiple of tp
(Megatron's ``--make-vocab-size-divisible-by`` rule with divisor 1); padded logits are cut
before the loss, so they never receive a gradient.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hetrl.errors import SpecError, require

#: The torch.distributed backend of a run's world on GPUs: CUDA tensors (Megatron's collectives)
#: over NCCL, CPU tensors (weight exports, the torch trainers' CPU path) over gloo.
GPU_BACKEND = "cpu:gloo,cuda:nccl"
GROUP_KINDS = ("tp", "pp", "dp", "mp", "embd", "pos_embd", "cp", "all")
EXPERT_GROUP_KINDS = ("ep", "tp_ep", "tp_ep_pp", "expt_dp")
MOE_GROUP_KINDS = ("tp_dp_cp",)
#: Megatron parameter names (after ``decoder.layers.{i}.``, or whole) split along rows / columns.
ROW_SPLIT = ("self_attention.linear_qkv.weight", "mlp.linear_fc1.weight",
             "embedding.word_embeddings.weight", "output_layer.weight")
COLUMN_SPLIT = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class MegatronGrid:
    """One training task's devices: ``devices[r][s][t]`` = replica r, stage s, tp rank t;
    ``boundaries`` = the stages' layer boundaries ([0, ..., layers], len pp + 1); ``ep`` the
    expert parallelism (replicas [k ep, (k + 1) ep) split the experts); ``moe`` whether the
    model is a mixture of experts."""

    task: str
    devices: tuple[tuple[tuple[int, ...], ...], ...]
    boundaries: tuple[int, ...]
    ep: int = 1
    moe: bool = False

    def __post_init__(self) -> None:
        require(len(self.devices) >= 1 and all(len(r) == self.pp for r in self.devices),
                "devices", self.devices, "must give every replica the same number of stages")
        require(all(len(s) == self.tp for r in self.devices for s in r), "devices", self.devices,
                "must give every stage the same number of tp ranks")
        flat = [d for r in self.devices for s in r for d in s]
        require(len(set(flat)) == len(flat), "devices", self.devices, "must not repeat a device")
        require(len(self.boundaries) == self.pp + 1 and self.boundaries[0] == 0 and all(
            a < b for a, b in zip(self.boundaries, self.boundaries[1:], strict=False)),
            "boundaries", self.boundaries, f"must rise from 0 with {self.pp + 1} entries")
        require(self.ep >= 1 and self.dp % self.ep == 0, "ep", self.ep,
                f"must divide the replicas ({self.dp})")
        require(self.moe or self.ep == 1, "ep", self.ep, "needs a mixture-of-experts model")

    @property
    def dp(self) -> int:
        return len(self.devices)

    @property
    def pp(self) -> int:
        return len(self.devices[0])

    @property
    def tp(self) -> int:
        return len(self.devices[0][0])

    def coords(self, device: int) -> tuple[int, int, int]:
        """(replica, stage, tp rank) of ``device``."""
        for r, replica in enumerate(self.devices):
            for s, stage in enumerate(replica):
                if device in stage:
                    return r, s, stage.index(device)
        raise SpecError(f"{self.task}.devices", device, "is not a device of this task")

    def groups(self) -> dict[str, tuple[int, ...]]:
        """Every Megatron group of the task: name -> devices, in the order of their ranks in the
        group (stage order for ``pp``, tp order for ``tp``, replica order for ``dp``)."""
        R, S, T = range(self.dp), range(self.pp), range(self.tp)
        d = self.devices
        members = {
            "tp": [d[r][s] for r in R for s in S],
            "pp": [tuple(d[r][s][t] for s in S) for r in R for t in T],
            "dp": [tuple(d[r][s][t] for r in R) for s in S for t in T],
            "mp": [tuple(x for s in S for x in d[r][s]) for r in R],
            "embd": [tuple(dict.fromkeys((d[r][0][t], d[r][-1][t]))) for r in R for t in T],
            "pos_embd": [(d[r][0][t],) for r in R for t in T],
            "cp": [(x,) for r in R for s in S for x in d[r][s]],
            "all": [tuple(x for r in R for s in S for x in d[r][s])],
        }
        kinds = GROUP_KINDS
        if self.moe:
            kinds += MOE_GROUP_KINDS
            members["tp_dp_cp"] = [tuple(d[r][s][t] for r in R for t in T) for s in S]
        if self.ep > 1:
            kinds += EXPERT_GROUP_KINDS
            blocks = [range(k, k + self.ep) for k in range(0, self.dp, self.ep)]
            members.update({
                "ep": [tuple(d[r][s][t] for r in b) for b in blocks for s in S for t in T],
                "tp_ep": [tuple(d[r][s][t] for r in b for t in T) for b in blocks for s in S],
                "tp_ep_pp": [tuple(d[r][s][t] for s in S for r in b for t in T) for b in blocks],
                "expt_dp": [tuple(d[r][s][t] for r in range(i, self.dp, self.ep))
                            for i in range(self.ep) for s in S for t in T],
            })
        return {f"{self.task}/megatron/{kind}/{i}": tuple(g)
                for kind in kinds for i, g in enumerate(members[kind])}

    def layer_split(self) -> tuple[int | None, int | None]:
        """Megatron's ``num_layers_in_first_pipeline_stage`` / ``..._last_...`` for these
        boundaries (None: even), or a SpecError when the middle stages are uneven (Megatron
        splits the layers between the first and the last stage evenly)."""
        sizes = [b - a for a, b in zip(self.boundaries, self.boundaries[1:], strict=False)]
        if len(sizes) == 1 or len(set(sizes)) == 1:
            return None, None
        middle = sizes[1:-1]
        require(len(set(middle)) <= 1, f"placements[{self.task}].layers_per_stage", sizes,
                "must give every stage between the first and the last the same number of "
                "layers: megatron-core places the first and last stages' layers freely and "
                "splits the rest evenly")
        return sizes[0], sizes[-1]


def create_groups(specs: Mapping[str, Sequence[int]], rank: int,
                  backend: str | None = None) -> dict[str, Any]:
    """``torch.distributed.new_group`` for every group of ``specs`` (name -> global ranks), in
    sorted name order (every process must call this with the same specs), each group's ranks in
    the order given (a stage's or tp rank's position in the grid, which Megatron reads off
    ``group.rank()``; torch would sort them), on ``backend`` (default the world's: gloo; with
    :data:`GPU_BACKEND` also NCCL for CUDA tensors); returns the groups ``rank`` belongs to."""
    import torch.distributed as dist

    out = {}
    for name in sorted(specs):
        ranks = list(specs[name])
        g = dist.new_group(ranks, backend=backend, sort_ranks=False)
        if rank in ranks:
            out[name] = g
    return out


def process_group_collection(grid: MegatronGrid, device: int, groups: Mapping[str, Any]) -> Any:
    """megatron-core's ``ProcessGroupCollection`` of ``device``'s rank in ``grid``, from the
    created ``groups`` (name -> process group, see :func:`create_groups`)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    mine = {}
    for name, devices in grid.groups().items():
        if device in devices:
            kind = name.split("/")[-2]
            require(name in groups, "groups", sorted(groups), f"lack {name}, a group of device "
                    f"{device}")
            mine[kind] = groups[name]
    pgc = ProcessGroupCollection()
    pgc.tp, pgc.pp, pgc.mp = mine["tp"], mine["pp"], mine["mp"]
    pgc.embd, pgc.pos_embd = mine.get("embd"), mine.get("pos_embd")  # None off those stages
    pgc.dp = pgc.dp_cp = pgc.intra_dp_cp = mine["dp"]
    pgc.tp_cp, pgc.cp = pgc.tp, mine["cp"]
    pgc.expt_tp = pgc.tp  # experts split over tp as the dense MLP
    if grid.moe:
        pgc.tp_dp_cp = mine["tp_dp_cp"]
    if grid.ep > 1:
        pgc.ep, pgc.tp_ep, pgc.tp_ep_pp = mine["ep"], mine["tp_ep"], mine["tp_ep_pp"]
        pgc.expt_dp = pgc.intra_expt_dp = mine["expt_dp"]
    else:  # no experts: expert parallel size 1 (the rank alone), expert groups the dense ones
        pgc.ep, pgc.tp_ep, pgc.tp_ep_pp = mine["cp"], pgc.tp, pgc.mp
        pgc.expt_dp = pgc.intra_expt_dp = pgc.dp
    # one distributed-optimizer instance over the task
    pgc.intra_dist_opt, pgc.inter_dist_opt = mine["all"], None
    return pgc


@contextlib.contextmanager
def task_world(group: Any) -> Iterator[None]:
    """Within the block, ``torch.distributed.get_world_size()`` and ``all_gather_object`` without
    a group mean ``group`` (the task's ``all`` group), restored on exit. megatron-core's
    optimizer aligns its parameter groups with an ``all_gather_object`` over the default world,
    which in a run also holds the generation and inference workers that never call it."""
    import torch.distributed as dist

    size, gather = dist.get_world_size, dist.all_gather_object
    task = group

    def world_size(group: Any = None) -> int:
        return size(task if group is None else group)

    def all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
        gather(object_list, obj, group=task if group is None else group)

    dist.get_world_size, dist.all_gather_object = world_size, all_gather_object
    try:
        yield
    finally:
        dist.get_world_size, dist.all_gather_object = size, gather


def mark_tensor_parallel(module: torch.nn.Module, value_model: bool = False) -> None:
    """Set megatron-core's tensor-parallel attributes (``tensor_model_parallel``,
    ``partition_dim``, ``partition_stride``) on the parameters :func:`shard` splits. Megatron
    sets them only while initialising weights itself (``perform_initialization``); these
    weights are loaded instead, and without the attributes the gradient norm would count a
    split weight on tensor rank 0 only, as if it were a copy."""
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    for name, p in module.named_parameters():
        kind = _kind(name)
        if not _whole(kind, value_model):
            set_tensor_model_parallel_attributes(p, True, 0 if kind in ROW_SPLIT else 1, 1)


def padded_vocab(vocab: int, tp: int) -> int:
    """Rows of the embedding and output layer: ``vocab`` rounded up to a multiple of ``tp``."""
    return math.ceil(vocab / tp) * tp


def stage_slice(state: Mapping[str, torch.Tensor], first: int, last: int, pre: bool,
                post: bool) -> dict[str, torch.Tensor]:
    """The tensors of a full Megatron state dict that the stage holding layers [first, last)
    keeps, its layers renumbered from 0 (Megatron numbers a stage's layers locally); ``pre``:
    the first stage (embedding), ``post``: the last (final norm, output layer)."""
    out = {}
    for name, t in state.items():
        m = _LAYER.match(name)
        if m:
            i = int(m.group(1))
            if first <= i < last:
                out[f"decoder.layers.{i - first}.{m.group(2)}"] = t
        elif name.startswith("embedding."):
            if pre:
                out[name] = t
        elif post:
            out[name] = t
    return out


_LOCAL_EXPERT = re.compile(r"^(decoder\.layers\.\d+\.mlp\.experts\.local_experts\.)(\d+)(\..+)$")


def expert_slice(state: Mapping[str, torch.Tensor], ep: int, rank: int,
                 experts: int) -> dict[str, torch.Tensor]:
    """The tensors of a Megatron state dict numbering all ``experts`` that expert-parallel rank
    ``rank`` of ``ep`` keeps: every non-expert tensor, and experts [rank E/ep, (rank + 1) E/ep)
    renumbered from 0 (Megatron's local expert indices)."""
    local = experts // ep
    out = {}
    for name, t in state.items():
        m = _LOCAL_EXPERT.match(name)
        if not m:
            out[name] = t
        elif rank * local <= int(m.group(2)) < (rank + 1) * local:
            out[f"{m.group(1)}{int(m.group(2)) - rank * local}{m.group(3)}"] = t
    return out


def global_expert_name(name: str, rank: int, local: int) -> str | None:
    """The name local expert tensor ``name`` of expert-parallel rank ``rank`` (``local``
    experts per rank) has among all experts; None for a tensor that is not an expert's."""
    m = _LOCAL_EXPERT.match(name)
    if not m:
        return None
    return f"{m.group(1)}{rank * local + int(m.group(2))}{m.group(3)}"


def renumber(state: Mapping[str, torch.Tensor], first: int) -> dict[str, torch.Tensor]:
    """A stage's state dict with its local layer numbers made global (layer i -> first + i)."""
    out = {}
    for name, t in state.items():
        m = _LAYER.match(name)
        out[f"decoder.layers.{int(m.group(1)) + first}.{m.group(2)}" if m else name] = t
    return out


_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.\d+\.")


def _kind(name: str) -> str:
    """A tensor's kind: its name after ``decoder.layers.{i}.``, an expert's fc1/fc2 as the
    dense MLP's (``mlp.linear_fc1.weight``)."""
    m = _LAYER.match(name)
    return _EXPERT.sub("mlp.", m.group(2)) if m else name


def _whole(kind: str, value_model: bool) -> bool:
    """Whether tensor ``kind`` is whole on every tensor rank (norms; the critic's value head)."""
    return (kind not in ROW_SPLIT and kind not in COLUMN_SPLIT) or (
        value_model and kind.startswith("output_layer."))


def shard(name: str, full: torch.Tensor, tp: int, rank: int, vocab_rows: int,
          value_model: bool = False) -> torch.Tensor:
    """Tensor rank ``rank``'s part of the full Megatron tensor ``name`` (vocabulary tensors
    first padded with zero rows to ``vocab_rows``; ``value_model``: the output layer is the
    critic's value head, whole everywhere)."""
    kind = _kind(name)
    if _whole(kind, value_model):
        return full.clone()
    if kind in VOCAB_ROWS and vocab_rows > full.shape[0]:
        full = torch.cat([full, full.new_zeros(vocab_rows - full.shape[0], *full.shape[1:])])
    if tp == 1:
        return full.clone()
    if kind == "mlp.linear_fc1.weight":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, dim=0)[rank], up.chunk(tp, dim=0)[rank]]).clone()
    return full.chunk(tp, dim=0 if kind in ROW_SPLIT else 1)[rank].clone()


def unshard(name: str, parts: Sequence[torch.Tensor], vocab: int,
            value_model: bool = False) -> torch.Tensor:
    """The full tensor ``name`` from its tp ranks' ``parts`` (in rank order), vocabulary rows cut
    back to ``vocab``; the inverse of :func:`shard`."""
    kind = _kind(name)
    if _whole(kind, value_model):
        return parts[0]
    if len(parts) == 1:
        full = parts[0]
    elif kind == "mlp.linear_fc1.weight":
        halves = [p.chunk(2, dim=0) for p in parts]
        full = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    else:
        full = torch.cat(list(parts), dim=0 if kind in ROW_SPLIT else 1)
    if kind in VOCAB_ROWS and full.shape[0] > vocab:
        full = full[:vocab]
    return full
