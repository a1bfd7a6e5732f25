"""``hetrl export --to verl --launcher run_plan.py``: a Python entry point that runs a plan on
verl with its resource pools on the plan's nodes.

The launcher is :mod:`hetrl.export.verl_run`, copied verbatim (no value of the plan is code);
the plan is data, ``run_plan.json`` beside it: verl's overrides, ``ResourcePoolManager``'s
``resource_pool_spec`` and ``mapping``, and the node resources that pin each pool. Node ``i``
of the cluster (its order in the cluster file) is Ray node resource ``hetrl_node_<i>`` (an
index, not its name: a name from a stranger's file never reaches a resource name or a shell
line); the nodes of a pool also hold ``hetrl_pool_<pool>``, which a standalone rollout's
replica pools ask for."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hetrl.errors import SpecError
from hetrl.export.verl_keys import CONFIG_NAMES, command_args

TEMPLATE = Path(__file__).with_name("verl_run.py")
RAY_PORT = 6379


def node_resource(index: int) -> str:
    """The Ray resource that marks cluster node ``index``."""
    return f"hetrl_node_{index}"


def data_path(launcher: str | Path) -> Path:
    """Where the launcher reads its data: beside it, ``.json``."""
    return Path(launcher).with_suffix(".json")


def check_paths(launcher: str | Path, *others: str | Path | None) -> None:
    """Refuse a launcher whose data file would be itself or another output."""
    p, d = Path(launcher), data_path(launcher)
    if p.suffix == ".json":
        raise SpecError("--launcher", str(launcher), "must not end in .json (its data file, "
                        f"{d.name}, goes beside it)")
    for other in filter(None, others):
        if Path(other).resolve() in (p.resolve(), d.resolve()):
            raise SpecError("--launcher", str(launcher), f"it (or its data file {d.name}) "
                            f"would overwrite {other}")


def launcher_data(layout, cluster, flat: Mapping[str, Any],
                  pools: Mapping[str, Any]) -> dict[str, Any]:
    """The launcher's data: overrides (Hydra arguments), pools, pins and each node's
    ``ray start`` line (the first of the plan's nodes is the head)."""
    index = {n.name: i for i, n in enumerate(cluster.nodes)}
    pins = {p.name: [node_resource(index[n]) for n in p.nodes] for p in layout.pools}
    used = [n for n in index if any(n in p.nodes for p in layout.pools)]
    nodes = []
    for k, name in enumerate(used):
        resources = {node_resource(index[name]): 1}
        resources.update({f"hetrl_pool_{p.name}": 1 for p in layout.pools if name in p.nodes})
        gpus = cluster.nodes[index[name]].count
        head = "--head" if k == 0 else f"--address=HEAD_IP:{RAY_PORT}"
        line = (f"ray start {head} --num-gpus={gpus} --resources="
                f"{shlex.quote(json.dumps(resources))}")
        nodes.append({"name": name, "index": index[name], "resources": resources,
                      "ray_start": line})
    return {"hetrl_launcher": 1, "config_name": CONFIG_NAMES[layout.strategy],
            "overrides": command_args(flat),
            "resource_pool_spec": pools["resource_pool_spec"], "mapping": pools["mapping"],
            "pins": pins, "nodes": nodes}


def launcher_files(data: Mapping[str, Any]) -> tuple[str, str]:
    """(the launcher's text, its data file's text)."""
    return TEMPLATE.read_text(encoding="utf-8"), json.dumps(data, indent=1) + "\n"


def ray_start_lines(data: Mapping[str, Any]) -> list[str]:
    """One line per node, for the export's text: the node's name (quoted) and its command."""
    return [f"on {shlex.quote(n['name'])}: {n['ray_start']}" for n in data["nodes"]]
