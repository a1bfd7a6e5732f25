"""An expert-parallel mixture-of-experts MLP for the real backend: a router, top-k experts
(SwiGLU) split over the ranks of a process group, and the all-to-alls that dispatch each token's
hidden state to its experts' ranks and combine the results (torch.distributed's differentiable
all-to-all, so a backward pass sends the gradients back the same way). Runs on gloo (CPU) and
NCCL alike.

Weights come from explicit seeds: the router from ``seed``, expert e from ``(seed, e)``, so a
rank holding experts [r E/ep, (r + 1) E/ep) has the weights a single process holding all E would
(:meth:`ExpertParallelMLP.reference` computes that single process's output). The layer counts the
bytes its all-to-alls move off the rank (``bytes_sent``), the quantity the cost model prices
(:func:`hetrl.cost.expert_parallel.dispatch_bytes`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

from hetrl.errors import positive_int, require


def _expert_weights(hidden: int, ffn: int, seed: int, expert: int) -> tuple[torch.Tensor, ...]:
    """Expert ``expert``'s (gate, up, down) weights, from its own seed."""
    g = torch.Generator().manual_seed(hash((seed, expert)) & 0x7FFFFFFF)
    scale = hidden ** -0.5
    return (torch.randn(ffn, hidden, generator=g) * scale,
            torch.randn(ffn, hidden, generator=g) * scale,
            torch.randn(hidden, ffn, generator=g) * ffn ** -0.5)


class ExpertParallelMLP(nn.Module):
    """``experts`` SwiGLU experts of width ``ffn`` split over the ``group``'s ranks (expert
    parallelism: ep = the group's size), each token routed to ``top_k`` of them (softmax over
    the router's logits, the top-k weights renormalised)."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int,
                 group: dist.ProcessGroup | None = None, seed: int = 0):
        super().__init__()
        for name, value in (("hidden", hidden), ("ffn", ffn), ("experts", experts),
                            ("top_k", top_k)):
            positive_int(f"moe.{name}", value)
        self.group = group
        self.ep = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        require(experts % self.ep == 0, "moe.experts", experts,
                f"must be a multiple of the expert-parallel size ({self.ep})")
        require(top_k <= experts, "moe.top_k", top_k, f"must be <= experts ({experts})")
        self.hidden, self.ffn, self.experts, self.top_k, self.seed = hidden, ffn, experts, top_k, seed
        self.local = experts // self.ep
        g = torch.Generator().manual_seed(seed)
        self.router = nn.Parameter(torch.randn(experts, hidden, generator=g) * hidden ** -0.5)
        mine = [_expert_weights(hidden, ffn, seed, self.rank * self.local + i)
                for i in range(self.local)]
        self.gate = nn.Parameter(torch.stack([w[0] for w in mine]))
        self.up = nn.Parameter(torch.stack([w[1] for w in mine]))
        self.down = nn.Parameter(torch.stack([w[2] for w in mine]))
        #: bytes this rank's all-to-alls sent to other ranks (dispatch and combine)
        self.bytes_sent = 0

    def route(self, x: torch.Tensor, logits: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts), each (tokens, top_k): the router's choice for ``x``, or for the
        given ``logits`` (tokens, experts)."""
        logits = x @ self.router.t() if logits is None else logits
        probs = torch.softmax(logits.float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        return (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype), chosen

    def forward(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output for ``x`` (tokens, hidden): dispatch, local experts, combine."""
        weights, chosen = self.route(x, logits)
        flat = chosen.reshape(-1)  # (tokens x top_k) expert ids, token-major
        dest = torch.div(flat, self.local, rounding_mode="floor")
        order = torch.argsort(dest, stable=True)
        send = x.repeat_interleave(self.top_k, dim=0)[order]
        send_counts = torch.bincount(dest, minlength=self.ep)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_sizes, recv_sizes = send_counts.tolist(), recv_counts.tolist()
        # the expert each row is for (ids are not differentiable: the plain collective)
        recv_ids = torch.empty(sum(recv_sizes), dtype=flat.dtype)
        dist.all_to_all_single(recv_ids, flat[order].contiguous(), recv_sizes, send_sizes,
                               group=self.group)
        recv = all_to_all_single(torch.empty(sum(recv_sizes), self.hidden, dtype=x.dtype),
                                 send.contiguous(), recv_sizes, send_sizes, group=self.group)
        out = torch.zeros_like(recv)
        local_ids = recv_ids - self.rank * self.local
        for e in range(self.local):
            rows = (local_ids == e).nonzero(as_tuple=True)[0]
            if rows.numel():
                h = recv[rows]
                act = torch.nn.functional.silu(h @ self.gate[e].t()) * (h @ self.up[e].t())
                out = out.index_add(0, rows, act @ self.down[e].t())
        back = all_to_all_single(torch.empty(send.shape[0], self.hidden, dtype=x.dtype), out,
                                 send_sizes, recv_sizes, group=self.group)
        row_bytes = self.hidden * x.element_size()
        self.bytes_sent += row_bytes * ((sum(send_sizes) - send_sizes[self.rank])
                                        + (sum(recv_sizes) - recv_sizes[self.rank]))
        combined = torch.empty_like(back).index_copy(0, order, back)  # token-major again
        per_choice = combined.view(x.shape[0], self.top_k, self.hidden)
        return (per_choice * weights.unsqueeze(-1)).sum(dim=1)

    @torch.no_grad()
    def reference(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        """What one process holding all the experts computes for ``x`` (no communication)."""
        weights, chosen = self.route(x, logits)
        out = torch.zeros_like(x)
        for e in range(self.experts):
            gate, up, down = _expert_weights(self.hidden, self.ffn, self.seed, e)
            tok, slot = (chosen == e).nonzero(as_tuple=True)
            if tok.numel():
                h = x[tok]
                y = (torch.nn.functional.silu(h @ gate.t()) * (h @ up.t())) @ down.t()
                out = out.index_add(0, tok, y * weights[tok, slot].unsqueeze(-1))
        return out
