"""HetRL's load balancer (paper: "Load balancer").

Data level: a replica's share of the batch is proportional to its speed, 1 / (its time for an
equal share) from the cost model, so that a DP group's replicas finish together.
Layer level: a pipeline's layers are split in proportion to each stage's speed (peak FLOP/s for
training and inference, HBM bandwidth for memory-bound generation), rounded by largest remainder,
at least one layer per stage, and capped so a stage's resident bytes fit its smallest device.
"""

from __future__ import annotations

from hetrl.cost.model import CostModel
from hetrl.plan import TaskPlacement, even_layers
from hetrl.shares import largest_remainder


def proportional_split(total: int, weights: list[float], caps: list[int] | None = None) -> tuple[int, ...]:
    """Integers >= 1 summing to ``total``, proportional to ``weights``: one each, the rest by
    :func:`hetrl.shares.largest_remainder`; each at most its cap when the caps allow it."""
    k = len(weights)
    if total < k:
        raise ValueError("fewer items than parts")
    wsum = sum(weights)
    out = largest_remainder([1 + (total - k) * w / wsum for w in weights], total)
    if caps is not None and sum(caps) >= total:
        # Move the excess of over-cap stages to the stages with the most room, one at a time.
        while True:
            over = [i for i in range(k) if out[i] > caps[i]]
            if not over:
                break
            i = over[0]
            j = max((j for j in range(k) if out[j] < caps[j]), key=lambda j: caps[j] - out[j])
            out[i] -= 1
            out[j] += 1
    return tuple(out)


def balance_layers(model: CostModel, p: TaskPlacement) -> TaskPlacement:
    if p.pp == 1:
        return p
    wl = model.workload
    task = wl.task(p.task)
    shape = wl.model(task.role)
    lists = model.cluster.topology.lists
    speed_of = lists["hbm_Bps"] if task.kind == "generation" else lists["flops"]
    memory_of = lists["memory_bytes"]
    speeds, caps = [], []
    per_layer = shape.params_per_layer / p.tp * (
        wl.bytes_per_value + (model.params.grad_bytes + model.params.optimizer_state_bytes / p.dp
                              if task.kind == "training" else 0.0))
    embed = shape.vocab * shape.hidden / p.tp * wl.bytes_per_value
    for j in range(p.pp):
        devs = [d for replica in p.devices for d in replica[j]]
        speeds.append(min([speed_of[d] for d in devs]))
        room = min([memory_of[d] for d in devs]) * model.params.usable_memory_fraction
        # keep a third of the memory for activations / KV cache, and room for embeddings
        caps.append(max(1, int((0.66 * room - (embed if j in (0, p.pp - 1) else 0)) // per_layer)))
    if len(set(speeds)) == 1:
        layers = even_layers(shape.layers, p.pp)
    else:
        layers = proportional_split(shape.layers, speeds, caps)
    if layers == p.layers_per_stage:
        return p
    return TaskPlacement(p.task, p.dp, p.pp, p.tp, p.devices, layers, p.data_weights, p.backend,
                         p.offload, p.ep)


def balance_data(model: CostModel, p: TaskPlacement) -> TaskPlacement:
    if p.dp == 1:
        return p
    even = (1.0,) * p.dp
    times = model.replica_seconds(p if p.data_weights == even else TaskPlacement(
        p.task, p.dp, p.pp, p.tp, p.devices, p.layers_per_stage, even, p.backend, p.offload,
        p.ep))
    if max(times) - min(times) <= 1e-9 * max(times):
        weights = (1.0,) * p.dp
    else:
        fastest = min(times)
        weights = tuple(round(fastest / t, 6) for t in times)
    if weights == p.data_weights:
        return p
    return TaskPlacement(p.task, p.dp, p.pp, p.tp, p.devices, p.layers_per_stage, weights, p.backend,
                         p.offload, p.ep)


def balance(model: CostModel, p: TaskPlacement) -> TaskPlacement:
    """Layer-level then data-level balancing of one placement (memoised per cost model: a
    search decodes the same placements again and again)."""
    return model.memoised(("balance", p), lambda: balance_data(model, balance_layers(model, p)))
