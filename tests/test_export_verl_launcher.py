"""``hetrl export --to verl --launcher run_plan.py``: the launcher is hetrl/export/verl_run.py
verbatim and the plan is its data; on a 3-node local Ray cluster (emulated GPUs, the node
resources the export prints) its pools' placement groups land on the plan's nodes; its ``main``
composes verl's config and reaches the trainer; hostile names run nothing."""

from __future__ import annotations

import json
import os
import runpy
import stat
import time
from pathlib import Path

import pytest
import yaml

from hetrl.export import verl_launcher
from hetrl.io import load_cluster, load_workload, save_plan
from tests.cli_helpers import assert_user_error, run
from tests.test_export_verl import HOSTILE, _pools, verl_installed  # noqa: F401 (fixture)

WORKLOAD = "qwen3-4b-ppo-async"


def _export(capsys, tmp_path: Path, names: list[str], actor_path: str | None = None,
            workload_name: str | None = None, models: bool = False) -> tuple[Path, dict, str]:
    """Export an async plan on three 2-GPU nodes named ``names``: generation on the first,
    the reward model on the second, the rest on the third (so Ray's own order would not do).
    ``models``: each model's path a local stand-in (tests/verl_accept.py; the actor's at
    ``actor_path``, relative to ``tmp_path``) that verl's checks load without a download.
    Returns (the launcher, its data, the command's stdout)."""
    wl = WORKLOAD
    if workload_name is not None:
        doc = load_workload(WORKLOAD).to_dict() | {"name": workload_name}
        (tmp_path / "w.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(doc))))
        wl = str(tmp_path / "w.yaml")
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text(yaml.safe_dump({"name": f"c {names[0]}", "nodes": [
        {"name": n, "gpu": "A100-80GB", "count": 2, "region": "us-east-1"} for n in names]}))
    workload, cluster = load_workload(wl), load_cluster(str(cluster_file))
    rest = tuple(t for t in workload.task_names if t not in ("actor_generation",
                                                            "reward_inference"))
    save_plan(_pools(workload, cluster, [(("actor_generation",), (0, 1), 1),
                                         (("reward_inference",), (2, 3), 1), (rest, (4, 5), 1)]),
              tmp_path / "p.json")
    launcher = tmp_path / "run_plan.py"
    extra = []
    if models:
        from tests.verl_accept import fake_model

        for role in ("actor", "critic", "reward"):
            where = tmp_path / (actor_path if role == "actor" and actor_path else role)
            fake_model(where, workload.model(role), "qwen3")
            path = actor_path if role == "actor" and actor_path else str(where)
            extra += ["--model-path", f"{role}={path}"]
    code, out, err = run(capsys, "export", "--to", "verl", "-w", wl, "-c", cluster_file, "-p",
                         tmp_path / "p.json", "--out", tmp_path / "o.yaml", "--launcher",
                         launcher, "--max-slowdown", "100", *extra)
    assert code == 0, err
    return launcher, json.loads((tmp_path / "run_plan.json").read_text()), out


def test_the_launcher_is_the_template_and_the_plan_its_data(capsys, tmp_path):
    launcher, data, out = _export(capsys, tmp_path, ["n0", "n1", "n2"])
    assert launcher.read_text() == verl_launcher.TEMPLATE.read_text()
    assert launcher.stat().st_mode & stat.S_IXUSR
    assert data["pins"] == {"global_pool": ["hetrl_node_2"], "rollout_pool": ["hetrl_node_0"],
                            "reward_pool": ["hetrl_node_1"]}
    assert data["resource_pool_spec"] == {"global_pool": [2], "rollout_pool": [2],
                                          "reward_pool": [2]}
    assert data["mapping"]["Rollout"] == "rollout_pool"
    assert data["mapping"]["RewardModel"] == "reward_pool"
    for node in data["nodes"]:
        assert f"on {node['name']}: {node['ray_start']}" in out
    assert data["nodes"][0]["ray_start"] == ("ray start --head --num-gpus=2 --resources="
                                             "'{\"hetrl_node_0\": 1, \"hetrl_pool_rollout_pool\":"
                                             " 1}'")


def test_launcher_is_for_verl_only_and_beside_its_data(capsys, tmp_path):
    args = ("export", "-w", WORKLOAD, "-c", "paper64-single-region", "-p", "x.json", "--out",
            tmp_path / "o")
    code, _, err = run(capsys, *args[:1], "--to", "openrlhf", *args[1:], "--launcher",
                       tmp_path / "r.py")
    assert_user_error(code, err, "--launcher", "--to verl only", command="export")
    with pytest.raises(Exception, match="must not end in .json"):
        verl_launcher.check_paths(tmp_path / "r.json")
    with pytest.raises(Exception, match="would overwrite"):
        verl_launcher.check_paths(tmp_path / "o.py", tmp_path / "o.json")


@pytest.mark.usefixtures("verl_installed")
def test_hostile_names_are_data_and_run_nothing(capsys, tmp_path):
    """Workload, cluster and node names and a model path holding quotes, $(...), backticks,
    ';': the launcher is still the template, and running its ``main`` (the trainer stubbed)
    gives verl each value unchanged and runs nothing else."""
    names = HOSTILE[:3]
    launcher, data, _ = _export(capsys, tmp_path, names, actor_path=HOSTILE[3],
                                workload_name=f"w {HOSTILE[5]}", models=True)
    assert launcher.read_text() == verl_launcher.TEMPLATE.read_text()
    assert [n["name"] for n in data["nodes"]] == names
    seen = []
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        module = runpy.run_path(str(launcher), run_name="run_plan")
        assert module["main"]([], run=lambda config, d: seen.append(config)) == 0
    finally:
        os.chdir(cwd)
    assert not list(tmp_path.rglob("PWNED"))
    assert seen[0].actor_rollout_ref.model.path == HOSTILE[3]


@pytest.mark.usefixtures("verl_installed")
def test_main_composes_verl_config_and_pins_the_trainer_pools(capsys, tmp_path):
    """``main`` composes the exported config (the plan's pools) and hands it to the trainer;
    the pinned trainer swaps its ResourcePoolManager for the pinned one, and refuses
    overrides that change a pool."""
    launcher, data, _ = _export(capsys, tmp_path, ["n0", "n1", "n2"], models=True)
    mod = runpy.run_path(str(launcher), run_name="run_plan")
    seen = []
    mod["main"](["trainer.total_epochs=1"], run=lambda config, d: seen.append((config, d)))
    config, got = seen[0]
    assert got == data
    assert mod["config_pools"](config) == data["resource_pool_spec"]
    with pytest.raises(mod["LauncherError"], match="global_pool"):
        mod["main"](["trainer.n_gpus_per_node=1"], run=lambda c, d: None)

    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.trainer.ppo.utils import Role

    class Trainer:  # verl's v1 trainer's _init_resource_pool_mgr, in short
        nodes = 1

        def _init_resource_pool_mgr(self):
            self.mapping = {Role.ActorRolloutRef: "global_pool", Role.Critic: "global_pool",
                            Role.RewardModel: "reward_pool"}
            self.resource_pool_manager = ResourcePoolManager(
                {"global_pool": [2] * self.nodes, "reward_pool": [2]}, self.mapping)

    trainer = mod["pinned_trainer"](Trainer, data)()
    trainer._init_resource_pool_mgr()
    manager = trainer.resource_pool_manager
    assert type(manager).__name__ == "PinnedResourcePoolManager"
    assert manager.mapping == trainer.mapping and manager.data == data
    wrong = mod["pinned_trainer"](type("Wider", (Trainer,), {"nodes": 2}), data)()
    with pytest.raises(mod["LauncherError"], match="global_pool"):
        wrong._init_resource_pool_mgr()


@pytest.mark.usefixtures("verl_installed")
def test_pools_land_on_the_plan_nodes_of_a_3_node_ray_cluster(capsys, tmp_path, monkeypatch):
    """A local Ray cluster of three nodes (2 emulated GPUs each, each started with the node
    resources of its ``ray start`` line): the launcher's pools' placement groups, and a
    standalone rollout replica's, land on the plan's nodes."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group_table, remove_placement_group

    launcher, data, _ = _export(capsys, tmp_path, ["n0", "n1", "n2"])
    mod = runpy.run_path(str(launcher), run_name="run_plan")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    temp = Path(f"/tmp/rl-{os.getuid()}")  # (short: Ray's socket paths)
    (temp / "ray").mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("RAY_TMPDIR", str(temp))
    if ray.is_initialized():
        ray.shutdown()
    # (n0, the head, is where Ray puts the first pool, global_pool, unpinned: the plan's is n2)
    nodes = data["nodes"]
    cluster = Cluster()
    try:
        ids = {}
        for node in nodes:
            ids[node["name"]] = cluster.add_node(
                num_cpus=8, num_gpus=2, resources=node["resources"],
                object_store_memory=100 * 1024**2, include_dashboard=False).node_id
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        index = {verl_launcher.node_resource(n["index"]): n["name"] for n in nodes}
        manager = mod["resource_pool_manager"](data)
        manager.create_resource_pool()
        for name, pool in manager.resource_pool_dict.items():
            pgs = pool.get_placement_groups()
            want = [ids[index[r]] for r in data["pins"][name]]
            assert [set(placement_group_table(pg)["bundles_to_node_id"].values())
                    for pg in pgs] == [{w} for w in want], name
        for pg in manager.resource_pool_dict["rollout_pool"].get_placement_groups():
            remove_placement_group(pg)
        for _ in range(100):  # (freed asynchronously)
            if ray.available_resources().get("GPU", 0) >= 2:
                break
            time.sleep(0.1)
        replica = mod["resource_pool_manager"](data, {"rollout_pool_0": [2]}, None, 2)
        replica.create_resource_pool()
        pg, = replica.resource_pool_dict["rollout_pool_0"].get_placement_groups()
        assert set(placement_group_table(pg)["bundles_to_node_id"].values()) == {ids["n0"]}
    finally:
        ray.shutdown()
        cluster.shutdown()
