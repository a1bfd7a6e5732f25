"""Expert parallelism for the real backend's mixture-of-experts models: the routed experts of
each MoE layer split over the ranks of a process group, and the all-to-alls that dispatch each
token's hidden state to its experts' ranks and combine the results (torch.distributed's
differentiable all-to-all, so a backward pass sends the gradients back the same way). Runs on
gloo (CPU) and NCCL alike.

:class:`ExpertParallelExperts` replaces transformers' ``Qwen3MoeExperts`` (the experts of one
layer stored as ``gate_up_proj`` [E, 2 f, h] and ``down_proj`` [E, h, f]) with this rank's slice
of them, experts [r E/ep, (r + 1) E/ep); the router stays replicated. Every rank builds the whole
model from one seed and keeps its slice, so the sharded model computes what the whole one does.
A layer counts the bytes its all-to-alls send off the rank (``bytes_sent``), the quantity the
cost model prices (:func:`hetrl.cost.expert_parallel.dispatch_bytes`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

from hetrl.errors import require


class ExpertParallelExperts(nn.Module):
    """This rank's slice of a layer's routed experts (``full``: a transformers
    ``Qwen3MoeExperts``, or any module with ``gate_up_proj``, ``down_proj`` and ``act_fn`` in
    its layout), called as the module it replaces: ``(hidden [T, h], top_k_index [T, k],
    top_k_weights [T, k]) -> [T, h]``."""

    def __init__(self, full: nn.Module, group: dist.ProcessGroup | None = None):
        super().__init__()
        self.group = group
        self.ep = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        experts = full.gate_up_proj.shape[0]
        require(experts % self.ep == 0, "moe.experts", experts,
                f"must be a multiple of the expert-parallel size ({self.ep})")
        self.experts, self.local = experts, experts // self.ep
        lo, hi = self.rank * self.local, (self.rank + 1) * self.local
        self.gate_up_proj = nn.Parameter(full.gate_up_proj.detach()[lo:hi].clone())
        self.down_proj = nn.Parameter(full.down_proj.detach()[lo:hi].clone())
        self.act_fn = full.act_fn
        #: bytes this rank's forward all-to-alls sent to other ranks (dispatch and combine); a
        #: backward pass sends the same bytes again
        self.bytes_sent = 0

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        x = hidden_states
        top_k = top_k_index.shape[1]
        flat = top_k_index.reshape(-1)  # (tokens x top_k) expert ids, token-major
        dest = torch.div(flat, self.local, rounding_mode="floor")
        order = torch.argsort(dest, stable=True)
        send = x.repeat_interleave(top_k, dim=0)[order]
        send_counts = torch.bincount(dest, minlength=self.ep)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_sizes, recv_sizes = send_counts.tolist(), recv_counts.tolist()
        # the expert each row is for (ids are not differentiable: the plain collective)
        recv_ids = torch.empty(sum(recv_sizes), dtype=flat.dtype, device=x.device)
        dist.all_to_all_single(recv_ids, flat[order].contiguous(), recv_sizes, send_sizes,
                               group=self.group)
        recv = all_to_all_single(x.new_empty(sum(recv_sizes), x.shape[1]), send.contiguous(),
                                 recv_sizes, send_sizes, group=self.group)
        out = torch.zeros_like(recv)
        local_ids = recv_ids - self.rank * self.local
        for e in range(self.local):
            rows = (local_ids == e).nonzero(as_tuple=True)[0]
            if rows.numel():
                gate, up = nn.functional.linear(recv[rows], self.gate_up_proj[e]).chunk(2, dim=-1)
                y = nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e])
                out = out.index_add(0, rows, y)
        back = all_to_all_single(x.new_empty(send.shape[0], x.shape[1]), out, send_sizes,
                                 recv_sizes, group=self.group)
        self.bytes_sent += x.shape[1] * x.element_size() * (
            (sum(send_sizes) - send_sizes[self.rank]) + (sum(recv_sizes) - recv_sizes[self.rank]))
        combined = torch.empty_like(back).index_copy(0, order, back)  # token-major again
        per_choice = combined.view(x.shape[0], top_k, x.shape[1])
        return (per_choice * top_k_weights.unsqueeze(-1).to(x.dtype)).sum(dim=1)

    @torch.no_grad()
    def gathered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's experts (``gate_up_proj``, ``down_proj``), all-gathered over the group:
        a collective every rank calls."""
        out = []
        for p in (self.gate_up_proj, self.down_proj):
            parts = [torch.empty_like(p) for _ in range(self.ep)]
            dist.all_gather(parts, p.detach().contiguous(), group=self.group)
            out.append(torch.cat(parts))
        return out[0], out[1]


def shard_experts(model: nn.Module, group: dist.ProcessGroup | None) -> dict[str, ExpertParallelExperts]:
    """Replace every routed-experts module of ``model`` (a submodule named ``experts`` with a
    ``gate_up_proj``) by this rank's :class:`ExpertParallelExperts`; returns them by module
    name (``model.layers.0.mlp.experts``)."""
    targets = [(name, m) for name, m in model.named_modules()
               if name.rsplit(".", 1)[-1] == "experts" and hasattr(m, "gate_up_proj")]
    out = {}
    for name, full in targets:
        parent = model.get_submodule(name.rsplit(".", 1)[0])
        out[name] = ExpertParallelExperts(full, group)
        parent.experts = out[name]
    return out
