#!/usr/bin/env python3
"""Run a hetrl plan on verl 0.9.1: ``python run_plan.py [extra Hydra overrides ...]``.

Written by ``hetrl export --to verl --launcher run_plan.py``, verbatim: this file holds no value
of the plan. Everything plan-specific (verl's overrides, the resource pools, which nodes each
pool takes) is data, read from the JSON file beside it (``run_plan.json``), so that no name from
a workload or cluster file is ever code.

Before running it, start Ray on every node of the plan with the node resources that pin the
pools there; the data file's ``ray_start`` holds each node's line (``hetrl export`` prints
them), of the form::

    ray start --head --num-gpus=8 --resources='{"hetrl_node_0": 1, "hetrl_pool_global_pool": 1}'
    ray start --address=HEAD:6379 --num-gpus=8 --resources='{"hetrl_node_1": 1, ...}'

then run this file on the head node. It composes verl's config (``main_ppo``'s Hydra config,
the exported overrides, then yours), runs ``main_ppo``'s checks, and starts verl's v1 trainer
through ``main_ppo.run_ppo`` with one change: every resource pool the trainer builds
(``ResourcePoolManager(resource_pool_spec, mapping)``) is a :class:`PinnedRayResourcePool`,
whose placement groups (one per node, verl's ``STRICT_PACK``) ask for the node's resource
``hetrl_node_<i>`` in each bundle, so Ray places pool ``p``'s ``j``-th node group on the plan's
``j``-th node of ``p``. A standalone rollout's replicas (verl's ``rollout_pool_<rank>``) ask for
``hetrl_pool_rollout_pool``, held by the rollout pool's nodes alone.

Needs verl 0.9.1 and Ray (not hetrl). Importing it runs nothing.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path

#: The data file: beside this one, same name, ``.json``.
DATA = Path(__file__).with_suffix(".json")
#: How much of a node resource each bundle asks for (Ray's smallest unit; a node holds 1).
PIN_AMOUNT = 1e-4
#: verl's names for a standalone rollout's replica pools (workers/rollout/replica.py).
REPLICA_POOL = re.compile(r"rollout_pool_\d+(_.*)?")


class LauncherError(RuntimeError):
    """The plan's data and verl's config disagree (or verl cannot run them as they are)."""


def load_data(path: str | os.PathLike | None = None) -> dict:
    """The plan's data (written by ``hetrl export``)."""
    with open(path or DATA, encoding="utf-8") as fh:
        data = json.load(fh)
    if data.get("hetrl_launcher") != 1:
        raise LauncherError(f"{path or DATA}: not a hetrl launcher data file (version 1)")
    return data


def pins_of(data: dict, pool: str, n_groups: int) -> list[dict[str, float]]:
    """The resources each of ``pool``'s ``n_groups`` placement groups asks for, per bundle
    (empty: a pool the plan does not place)."""
    if pool in data["pins"]:
        nodes = data["pins"][pool]
        if len(nodes) != n_groups:
            raise LauncherError(f"verl's {pool} has {n_groups} node(s), the plan's {len(nodes)} "
                                f"({data['resource_pool_spec'].get(pool)} GPUs per node)")
        return [{r: PIN_AMOUNT} for r in nodes]
    if REPLICA_POOL.fullmatch(pool) and "rollout_pool" in data["pins"]:
        return [{"hetrl_pool_rollout_pool": PIN_AMOUNT}] * n_groups
    return [{}] * n_groups


def _pool_classes():
    """verl's pool classes, subclassed to pin (imported late: importing this file runs
    nothing)."""
    from ray.util.placement_group import placement_group
    from verl.plugin.platform import get_platform
    from verl.single_controller.ray.base import (
        RayResourcePool,
        ResourcePoolManager,
        sort_placement_group_by_node_ip,
    )

    class PinnedRayResourcePool(RayResourcePool):
        """verl's RayResourcePool whose ``j``-th placement group also asks for ``pins[j]``."""

        def __init__(self, *args, pins: list[dict[str, float]] | None = None, **kwargs):
            super().__init__(*args, **kwargs)
            self.pins = pins or [{}] * len(self._store)

        def get_placement_groups(self, strategy="STRICT_PACK", name=None, device_name="cuda"):
            """verl's get_placement_groups (bundles of CPU, one GPU, the accelerator type),
            with the pins."""
            if self.pgs is not None:
                return self.pgs
            prefix = name or (f"{self.name_prefix}verl_group_"
                              f"{'_'.join(str(c) for c in self._store)}:")
            bundle = {"CPU": self.max_colocate_count}
            if self.use_gpu:
                bundle[get_platform().ray_resource_name()] = 1
                if self.accelerator_type is not None:
                    bundle[self.accelerator_type] = 1e-4
            import ray

            pgs = [placement_group(bundles=[{**bundle, **pin} for _ in range(count)],
                                   strategy=strategy, name=prefix + str(i),
                                   lifetime="detached" if self.detached else None)
                   for i, (count, pin) in enumerate(zip(self._store, self.pins, strict=True))]
            ray.get([pg.ready() for pg in pgs])
            self.pgs = sort_placement_group_by_node_ip(pgs)
            return self.pgs

    class PinnedResourcePoolManager(ResourcePoolManager):
        """verl's ResourcePoolManager whose pools are pinned to the plan's nodes (``data``)."""

        def __init__(self, *args, data: dict | None = None, **kwargs):
            super().__init__(*args, **kwargs)
            self.data = data or {"pins": {}}

        def create_resource_pool(self):
            for name, process_on_nodes in self.resource_pool_spec.items():
                self.resource_pool_dict[name] = PinnedRayResourcePool(
                    process_on_nodes=process_on_nodes, use_gpu=True,
                    max_colocate_count=self.max_colocate_count, name_prefix=name,
                    pins=pins_of(self.data, name, len(process_on_nodes)))
            self._check_resource_available()

    return PinnedRayResourcePool, PinnedResourcePoolManager


def resource_pool_manager(data: dict, resource_pool_spec: dict | None = None,
                          mapping: dict | None = None, max_colocate_count: int = 3):
    """verl's ``ResourcePoolManager(resource_pool_spec, mapping)``, pinned: the plan's pools
    and role mapping by default."""
    _, manager = _pool_classes()
    return manager(resource_pool_spec=resource_pool_spec or data["resource_pool_spec"],
                   mapping=data["mapping"] if mapping is None else mapping,
                   max_colocate_count=max_colocate_count, data=data)


def check_trainer_pools(data: dict, spec: dict, mapping: dict) -> None:
    """Refuse a trainer whose pools (``resource_pool_spec``, role to pool) are not the plan's:
    e.g. extra overrides that changed ``trainer.nnodes``."""
    for pool, counts in spec.items():
        planned = data["resource_pool_spec"].get(pool)
        if planned is not None and list(counts) != list(planned):
            raise LauncherError(f"verl's {pool} is {list(counts)} GPUs per node, the plan's "
                                f"{planned}: drop the overrides that change it")
    for role, pool in mapping.items():
        name = getattr(role, "name", str(role))
        planned = data["mapping"].get("Actor" if name.startswith("Actor") else name)
        if planned is not None and planned != pool:
            raise LauncherError(f"verl puts {name} in {pool}, the plan in {planned}")


def config_pools(config) -> dict[str, list[int]]:
    """The pools verl's v1 trainer builds from ``config`` (trainer_base.py's
    ``_init_resource_pool_mgr``; the standalone rollout's, ``rollout_pool``, in its replicas)."""
    t, rollout, rm = config.trainer, config.actor_rollout_ref.rollout, config.reward.reward_model
    out = {"global_pool": [t.n_gpus_per_node] * t.nnodes}
    if rm.enable_resource_pool:
        out["reward_pool"] = [rm.n_gpus_per_node] * rm.nnodes
    if t.v1.trainer_mode == "separate_async" and not config.actor_rollout_ref.hybrid_engine:
        out["rollout_pool"] = [rollout.n_gpus_per_node] * rollout.nnodes
    return out


def pinned_trainer(base: type, data: dict) -> type:
    """verl trainer class ``base`` with its resource pools pinned to the plan's nodes."""

    class PinnedTrainer(base):
        def _init_resource_pool_mgr(self):
            super()._init_resource_pool_mgr()
            mgr = self.resource_pool_manager
            check_trainer_pools(data, mgr.resource_pool_spec, self.mapping)
            self.resource_pool_manager = resource_pool_manager(
                data, mgr.resource_pool_spec, mgr.mapping, mgr.max_colocate_count)

    PinnedTrainer.__name__ = PinnedTrainer.__qualname__ = f"Pinned{base.__name__}"
    return PinnedTrainer


def install(data: dict) -> None:
    """Pin every pool verl builds in this process: the trainer's (``get_trainer_cls``) and a
    standalone rollout's replicas' (``replica.ResourcePoolManager``)."""
    import verl.trainer.ppo.v1 as v1
    import verl.workers.rollout.replica as replica

    get = getattr(v1.get_trainer_cls, "__wrapped__", v1.get_trainer_cls)
    v1.get_trainer_cls = functools.wraps(get)(lambda mode: pinned_trainer(get(mode), data))
    replica.ResourcePoolManager = functools.partial(_pool_classes()[1], data=data)


def task_runner(data: dict):
    """main_ppo's TaskRunnerV1 (a Ray actor class) that pins the pools before it trains."""
    import ray
    from verl.trainer.main_ppo import TaskRunnerV1

    class PinnedTaskRunner(TaskRunnerV1.__ray_actor_class__):
        def run(self, config):
            install(data)
            return super().run(config)

    return ray.remote(PinnedTaskRunner)


def compose(data: dict, argv: list[str]):
    """verl's config as ``main_ppo`` composes it: its Hydra config, the plan's overrides, then
    ``argv``; checked by ``validate_config`` as ``main_ppo`` checks it."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = hydra_compose(config_name=data["config_name"],
                               overrides=list(data["overrides"]) + list(argv))
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config))
    if not config.trainer.use_v1:
        raise LauncherError("trainer.use_v1 is false: the launcher pins the v1 trainer's pools")
    return config


def start(config, data: dict) -> None:
    """Train: ``main_ppo.run_ppo`` with the pinned task runner."""
    from verl.trainer.main_ppo import run_ppo

    run_ppo(config, task_runner_class=task_runner(data))


def main(argv: list[str] | None = None, data_path: str | None = None, run=start) -> int:
    """Compose, check, and ``run(config, data)`` (verl's trainer by default)."""
    data = load_data(data_path)
    config = compose(data, sys.argv[1:] if argv is None else argv)
    pools = config_pools(config)
    if set(pools) != set(data["resource_pool_spec"]):
        raise LauncherError(f"verl's config builds pools {sorted(pools)}, the plan has "
                            f"{sorted(data['resource_pool_spec'])}: drop the overrides that "
                            "change them")
    check_trainer_pools(data, pools, {})
    run(config, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
