"""``hetrl export --to openrlhf``: every flag of the launch script is one OpenRLHF 0.11.2 defines,
every value parses with its declared type and passes OpenRLHF's own checks, and names from
hostile files run nothing but the entry point.

OpenRLHF's parser is OpenRLHF's own code: ``openrlhf/cli/train_ppo_ray.py`` builds it inside
``if __name__ == "__main__":`` (importing the module builds nothing, and needs ray, vLLM and
DeepSpeed besides). The tests parse that file with :mod:`ast` and execute the block's statements
-- the ``ArgumentParser``, every ``add_argument``, ``parse_args`` on the exported arguments, then
OpenRLHF's post-parse checks (its asserts) -- with ``train(args)`` recording the arguments
instead of training. The source comes from the installed ``openrlhf`` distribution (``.ci/run``
installs it with ``pip install --no-deps openrlhf==0.11.2``, a 200 KB wheel, 1-3 s), else
from the wheel ``pip download --no-deps`` fetches (the CPython 3.11 x86-64 one, whatever runs the
tests: only its Python source is read); without either those checks skip."""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import json
import os
import shlex
import stat
import subprocess
import sys
import types
import zipfile
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from hetrl.cost.model import CostModel
from hetrl.export import openrlhf as orl
from hetrl.io import load_cluster, load_plan, load_workload, save_plan
from hetrl.plan import Plan, TaskGroup, colocated_plan, make_placement
from tests.cli_helpers import assert_user_error, run
from tests.hostile import cluster_doc, workload_doc

MAIN = "openrlhf/cli/train_ppo_ray.py"
CONFIG = "openrlhf/utils/config.py"


def _installed_sources() -> dict[str, str] | None:
    try:
        dist = importlib.metadata.distribution("openrlhf")
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != orl.OPENRLHF_VERSION:
        return None
    return {name: Path(dist.locate_file(name)).read_text() for name in (MAIN, CONFIG)}


def _wheel_sources(where: Path) -> dict[str, str]:
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                               "--only-binary=:all:", "--python-version", "3.11", "--platform",
                               "manylinux1_x86_64", "-d", str(where),
                               f"openrlhf=={orl.OPENRLHF_VERSION}"],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"openrlhf=={orl.OPENRLHF_VERSION} is not installed and cannot be "
                    f"downloaded: {exc}")
    wheels = list(where.glob("openrlhf-*.whl"))
    if done.returncode != 0 or not wheels:
        pytest.skip(f"openrlhf=={orl.OPENRLHF_VERSION} is not installed (.ci/run installs it "
                    "with --no-deps) and cannot be downloaded (no package index?): "
                    f"{(done.stderr or done.stdout).strip()[-300:]}")
    with zipfile.ZipFile(wheels[0]) as wheel:  # (its files sit under openrlhf-*.data/purelib/)
        names = wheel.namelist()
        return {name: wheel.read(next(n for n in names if n.endswith(name))).decode()
                for name in (MAIN, CONFIG)}


class _Refused(Exception):
    """argparse's error (an unknown flag, a value its type or choices refuse)."""


@pytest.fixture(scope="module")
def openrlhf_main(tmp_path_factory):
    """``train_ppo_ray.py``'s main block as a function: exported argv -> (hierarchized args,
    the option strings its parser defines). Raises _Refused or OpenRLHF's AssertionError."""
    sources = _installed_sources() or _wheel_sources(tmp_path_factory.mktemp("openrlhf"))
    tree = ast.parse(sources[MAIN])
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and ast.unparse(n.test) == "__name__ == '__main__'")
    # (hierarchize comes from its own small file: importing openrlhf.utils pulls in torch)
    body = [s for s in block.body
            if not (isinstance(s, ast.ImportFrom) and s.module == "openrlhf.utils.config")]
    assert len(body) == len(block.body) - 1, "train_ppo_ray.py's main block changed shape"
    code = compile(ast.Module(body=body, type_ignores=[]), f"{MAIN} (main block)", "exec")
    config: dict = {}
    exec(compile(sources[CONFIG], CONFIG, "exec"), config)

    def main(argv: list[str]):
        seen: dict = {}

        class Parser(argparse.ArgumentParser):
            def error(self, message):
                raise _Refused(message)

            def parse_args(self, args=None, namespace=None):
                seen["options"] = set(self._option_string_actions)
                return super().parse_args(argv, namespace)

        env = {"__name__": "__main__", "argparse": types.SimpleNamespace(ArgumentParser=Parser),
               "datetime": datetime, "hierarchize": config["hierarchize"],
               "train": lambda args: seen.setdefault("args", args),
               "print": lambda *a, **k: None}
        exec(code, env)
        return seen["args"], seen["options"]

    return main


def _pools(workload, pools) -> Plan:
    """A plan of task groups: (tasks, devices, tp), every task on all of its group's devices."""
    groups, placements = [], []
    for tasks, devices, tp in pools:
        groups.append(TaskGroup(tasks, tuple(devices)))
        for t in tasks:
            placements.append(make_placement(t, tuple(devices), len(devices) // tp, 1, tp,
                                             workload.model(workload.task(t).role).layers))
    order = {t: i for i, t in enumerate(workload.task_names)}
    return Plan(tuple(groups), tuple(sorted(placements, key=lambda p: order[p.task])))


def _fsdp(plan: Plan) -> Plan:
    return replace(plan, placements=tuple(
        p if p.task == "actor_generation" else replace(p, backend="fsdp", tp=1, pp=1)
        for p in plan.placements))


def _cases():
    """(name, workload, cluster, plan builder, expected switches)."""
    def coloc(w, c):
        return colocated_plan(w, c, tp=2, pp=2)

    def coloc_fsdp(w, c):
        return _fsdp(colocated_plan(w, c))

    def split(w, c):  # generation | actor + reference | critic + reward
        return _pools(w, [(("actor_generation",), range(16), 2),
                             (("reference_inference", "actor_training"), range(16, 40), 1),
                             (("reward_inference", "critic_inference", "critic_training"),
                              range(40, 64), 1)])

    def async_three(w, c):  # generation | reward | the rest, one node each
        rest = tuple(t for t in w.task_names if t not in ("actor_generation", "reward_inference"))
        return _pools(w, [(("actor_generation",), range(8), 2),
                             (("reward_inference",), range(8, 16), 1), (rest, range(16, 24), 2)])

    def async_two(w, c):  # generation | every DeepSpeed model
        rest = tuple(t for t in w.task_names if t != "actor_generation")
        return _pools(w, [(("actor_generation",), range(8), 2), (rest, range(8, 24), 1)])

    return [
        ("colocated-ppo", "qwen3-4b-ppo-sync", "paper64-single-region", coloc,
         {"--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"}),
        ("colocated-grpo-fsdp", "qwen3-4b-grpo-sync", "paper64-single-region", coloc_fsdp,
         {"--train.colocate_all", "--algo.kl.use_loss"}),
        ("split-ppo", "qwen3-4b-ppo-sync", "paper64-multi-country", split,
         {"--train.colocate_actor_ref", "--train.colocate_critic_reward"}),
        ("async-three-groups", "qwen3-4b-ppo-async", "hetero24-two-region", async_three,
         {"--train.async_enable", "--train.colocate_actor_ref"}),
        ("async-two-groups", "qwen3-4b-ppo-async", "hetero24-two-region", async_two,
         {"--train.async_enable", "--train.colocate_all"}),
    ]


@pytest.mark.parametrize("name,workload_name,cluster_name,build,switches", _cases(),
                         ids=[c[0] for c in _cases()])
def test_export_parses_under_openrlhf(capsys, tmp_path, openrlhf_main, name, workload_name,
                                      cluster_name, build, switches):
    workload, cluster = load_workload(workload_name), load_cluster(cluster_name)
    save_plan(build(workload, cluster), tmp_path / "plan.json")
    out, closest_file = tmp_path / "run.sh", tmp_path / "closest.json"
    code, text, err = run(capsys, "export", "--to", "openrlhf", "-w", workload_name, "-c",
                          cluster_name, "-p", tmp_path / "plan.json", "--out", out,
                          "--closest-plan", closest_file, "--json")
    assert code == 0, err
    report = json.loads(text)
    script = out.read_text()
    assert os.stat(out).st_mode & stat.S_IXUSR and script.startswith("#!/usr/bin/env bash\n")
    argv = report["argv"]
    assert argv[:3] == list(orl.ENTRY_POINT)
    assert _script_argv(script) == argv  # the file says what the report says
    args, options = openrlhf_main(argv[3:])  # parses, and OpenRLHF's own asserts pass
    flags = [a for a in argv[3:] if a.startswith("--")]
    assert set(flags) <= options, "flags OpenRLHF does not define (or abbreviations)"
    assert switches <= set(flags)
    groups = {tuple(g["models"]): g["devices"] for g in report["placement_groups"]}
    gpus = {m: len(d) for ms, d in groups.items() for m in ms}
    assert args.actor.num_nodes * args.actor.num_gpus_per_node == gpus["actor"]
    assert args.vllm.num_engines * args.vllm.tensor_parallel_size == gpus["vllm"]
    if workload.algorithm == "ppo":
        assert args.critic.num_nodes * args.critic.num_gpus_per_node == gpus["critic"]
        assert args.algo.advantage.estimator == "gae" and args.critic.model_name_or_path
    else:
        assert args.algo.advantage.estimator == "group_norm"
        assert args.critic.model_name_or_path is None  # (OpenRLHF drops the critic itself)
    assert args.rollout.batch_size == workload.batch_prompts
    assert args.rollout.n_samples_per_prompt == workload.responses_per_prompt
    assert args.train.batch_size * workload.optimizer_steps == \
        workload.batch_prompts * workload.responses_per_prompt
    assert args.data.max_len == workload.prompt_length.max + workload.response_length.max
    assert args.train.async_enable == (workload.mode == "async")
    assert args.actor.model_name_or_path == f"Qwen/{workload.model('actor').name}"
    used = sorted(d for ds in groups.values() for d in ds)
    assert len(used) == len(set(used)) and set(used) <= set(range(cluster.num_devices))
    # the closest plan written is the one estimated
    closest = load_plan(closest_file, workload, cluster)
    est = CostModel(workload, cluster).estimate(closest)
    assert est.iteration_s == pytest.approx(report["iteration_s"]["closest_openrlhf_plan"])
    assert {p.task: len(p.device_ids) for p in closest.placements}["actor_training"] == \
        gpus["actor"]
    assert "What OpenRLHF cannot express" in script
    if name == "colocated-ppo":
        assert len(groups) == 1 and args.vllm.gpu_memory_utilization == 0.5
        assert args.ds.zero_stage == 3  # (Megatron's tp x pp: ZeRO-3 shards the weights)
    if name == "split-ppo":
        assert groups == {("vllm",): list(range(16)), ("actor", "ref"): list(range(16, 40)),
                          ("critic", "reward"): list(range(40, 64))}
        assert args.ds.zero_stage == 1
    if name == "async-three-groups":  # actor + ref and the critic split the rest's 8 GPUs
        assert set(groups) == {("vllm",), ("actor", "ref"), ("critic",), ("reward",)}
        assert any("split between placement groups" in d for d in report["differences"])


def _script_argv(script: str) -> list[str]:
    """The words of the script's one command (comments and ``set`` aside), ``"$@"`` left out."""
    body = [line for line in script.splitlines() if not line.startswith("#")]
    assert body[0] == "set -euo pipefail"
    words = shlex.split("\n".join(body[1:]).replace("\\\n", " "))  # (bash's line joins)
    assert words[0] == "exec" and words[-1] == "$@"
    return words[1:-1]


def test_async_generation_sharing_the_trainers_gpus_is_refused(capsys, tmp_path):
    workload, cluster = load_workload("qwen3-4b-ppo-async"), load_cluster("hetero24-two-region")
    save_plan(colocated_plan(workload, cluster), tmp_path / "plan.json")
    out = tmp_path / "run.sh"
    code, _, err = run(capsys, "export", "--to", "openrlhf", "-w", "qwen3-4b-ppo-async", "-c",
                       "hetero24-two-region", "-p", tmp_path / "plan.json", "--out", out)
    assert_user_error(code, err, "actor_generation shares its GPUs", "--train.async_enable",
                      command="export")
    assert not out.exists()


def _write(path: Path, doc) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_custom_model_needs_its_path(capsys, tmp_path, openrlhf_main):
    """The tiny workload's models have no Hugging Face id: refused until --model-path names
    them; a path OpenRLHF could not take as one argument is refused too."""
    wl = workload_doc()
    wl["inference_micro_batch_size"] = 2  # (OpenRLHF: >= 1 micro-batch per actor GPU)
    w = _write(tmp_path / "w.yaml", wl)
    save_plan(colocated_plan(load_workload(w), load_cluster("tiny4-single-region")),
              tmp_path / "plan.json")
    base = ("export", "--to", "openrlhf", "-w", w, "-c", "tiny4-single-region", "-p",
            tmp_path / "plan.json", "--out", tmp_path / "run.sh")
    code, _, err = run(capsys, *base)
    assert_user_error(code, err, "--model-path", "actor", "tiny-qwen3", command="export")
    code, _, err = run(capsys, *base, "--model-path", "actor=/m/a", "--model-path",
                       "reward=/m/r\nx")
    assert_user_error(code, err, "--model-path reward", "printable", command="export")
    code, _, err = run(capsys, *base, "--model-path", "actor=-rf")
    assert_user_error(code, err, "--model-path actor", "'-'", command="export")
    code, _, err = run(capsys, *base, "--model-path", "ref=/m/a")
    assert_user_error(code, err, "--model-path", "ref", command="export")
    code, text, err = run(capsys, *base, "--model-path", "actor=/m/a b", "--model-path",
                          "reward=/m/r", "--json")
    assert code == 0, err
    args, _ = openrlhf_main(json.loads(text)["argv"][3:])
    assert args.actor.model_name_or_path == "/m/a b" and args.reward.model_name_or_path == "/m/r"
    # verl reads --model-path too: each role it loads needs one
    code, _, err = run(capsys, "export", "--to", "verl", *base[3:], "--model-path", "actor=/m")
    assert_user_error(code, err, "models.reward", "--model-path reward=PATH", command="export")


HOSTILE = "x'\"; $(touch PWNED) `touch PWNED2`; touch PWNED3 #"


def test_hostile_names_run_nothing_but_the_entry_point(capsys, tmp_path):
    """Quotes, $(...), backticks, ';' and newlines in workload, cluster, model, node and GPU
    names: the script, run with a fake python3 on PATH, starts only that python3, with exactly
    the exported arguments, and creates no file."""
    wl = workload_doc()
    wl["name"] = "w\n" + HOSTILE + "\ntouch PWNED4"
    wl["inference_micro_batch_size"] = 2
    for role in wl["models"]:
        wl["models"][role]["name"] = "Qwen3-" + HOSTILE
    cl = cluster_doc()
    cl["name"] = "c\r\n" + HOSTILE
    cl["nodes"][0]["name"] = "n;" + HOSTILE
    w, c = _write(tmp_path / "w.yaml", wl), _write(tmp_path / "c.yaml", cl)
    workload, cluster = load_workload(w), load_cluster(c)
    save_plan(colocated_plan(workload, cluster), tmp_path / "plan.json")
    work = tmp_path / "work"
    work.mkdir()
    out = work / "run.sh"
    # (a model of the user's own: its path given, hostile too)
    code, text, err = run(capsys, "export", "--to", "openrlhf", "-w", w, "-c", c, "-p",
                          tmp_path / "plan.json", "--out", out, "--json", "--model-path",
                          f"actor=/models/{HOSTILE}", "--model-path", f"reward=/rm/{HOSTILE}")
    assert code == 0, err
    argv = json.loads(text)["argv"]
    assert f"/models/{HOSTILE}" in argv and f"/rm/{HOSTILE}" in argv
    fake = tmp_path / "bin"
    fake.mkdir()
    record = tmp_path / "argv.json"
    (fake / "python3").write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n")
    (fake / "python3").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(out), "--data.prompt_dataset", "d; touch PWNED5"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(calls) == 1  # one process: the entry point
    assert calls[0][1:] == argv[1:] + ["--data.prompt_dataset", "d; touch PWNED5"]
    assert sorted(p.name for p in work.iterdir()) == ["run.sh"]
    assert not list(tmp_path.glob("PWNED*"))
    # a path holding a newline is refused, not written
    code, _, err = run(capsys, "export", "--to", "openrlhf", "-w", w, "-c", c, "-p",
                       tmp_path / "plan.json", "--out", work / "bad.sh", "--model-path",
                       "actor=/m/x\n$(touch PWNED)", "--model-path", "reward=/rm")
    assert code == 2 and "Traceback" not in err and not (work / "bad.sh").exists()


def test_rule_reward_without_kl_and_token_budgets(capsys, tmp_path, openrlhf_main):
    """GRPO with a rule reward and no KL (no reward model, no reference), token-budget batching
    and an eager engine: the reward_func file, KL coefficient 0, dynamic batching, all parsed."""
    from hetrl.spec.presets import workload_preset

    doc = workload_preset("qwen3-4b-grpo-sync").to_dict()
    doc.update(name="grpo-rule", reward="rule", kl="none", recompute_logprobs=True,
               micro_batch_tokens=8192, inference_micro_batch_tokens=16384,
               gen_cuda_graphs=False)
    doc["models"] = {"actor": doc["models"]["actor"]}
    w = _write(tmp_path / "w.yaml", doc)
    workload, cluster = load_workload(w), load_cluster("paper64-single-region")
    save_plan(_fsdp(colocated_plan(workload, cluster)), tmp_path / "plan.json")
    code, text, err = run(capsys, "export", "--to", "openrlhf", "-w", w, "-c",
                          "paper64-single-region", "-p", tmp_path / "plan.json", "--out",
                          tmp_path / "run.sh", "--model-path", "reward=/r/math reward.py",
                          "--json")
    assert code == 0, err
    report = json.loads(text)
    args, _ = openrlhf_main(report["argv"][3:])
    assert args.reward.remote_url == ["/r/math reward.py"] and args.algo.kl.init_coef == 0
    assert not args.algo.kl.use_loss and args.vllm.enforce_eager and args.ds.zero_stage == 3
    assert args.train.dynamic_batch_enable and args.train.max_tokens_per_gpu == 8192
    assert args.rollout.max_tokens_per_gpu == 16384 and args.ds.packing_samples
    assert "--ref.num_nodes" not in report["argv"] and "--reward.num_nodes" not in report["argv"]
    assert report["ratio"] == pytest.approx(1.0)


def test_openrlhf_refuses_expert_parallelism_and_fp8_naming_what_it_lacks(capsys, tmp_path):
    from hetrl.io import load_cluster, load_workload, save_plan
    from hetrl.plan import colocated_plan

    cluster_file = tmp_path / "h100x16.yaml"
    cluster_file.write_text("name: h100x16\nnodes:\n  - {gpu: H100, count: 8, repeat: 2}\n")
    workload, cluster = load_workload("qwen3-30b-a3b-grpo-sync"), load_cluster(str(cluster_file))
    save_plan(colocated_plan(workload, cluster, tp=2, ep=4), tmp_path / "plan.json")
    code, _, err = run(capsys, "export", "--to", "openrlhf", "-w", "qwen3-30b-a3b-grpo-sync",
                       "-c", cluster_file, "-p", tmp_path / "plan.json", "--out",
                       tmp_path / "run.sh")
    assert_user_error(code, err, "placements[actor_generation].ep = 4",
                      "OpenRLHF 0.11.2 has no expert parallelism")
    assert not (tmp_path / "run.sh").exists()


def test_a_built_in_model_needs_no_path(capsys, tmp_path, openrlhf_main):
    """Issue 58: Llama-3.1-8B GRPO with a rule reward exported to OpenRLHF without
    --model-path: the actor loads from the built-in model's Hugging Face id, as verl's export
    does (one table: hetrl.spec.model.hf_id)."""
    from hetrl.spec.model import hf_id, model_presets
    from hetrl.spec.presets import workload_preset

    doc = workload_preset("qwen3-8b-grpo-sync").to_dict()
    doc.pop("models")
    doc.update(name="llama-grpo", model="Llama-3.1-8B", reward="rule", kl="none")
    w = _write(tmp_path / "w.yaml", doc)
    workload, cluster = load_workload(w), load_cluster("paper64-single-region")
    save_plan(_fsdp(colocated_plan(workload, cluster)), tmp_path / "plan.json")
    code, text, err = run(capsys, "export", "--to", "openrlhf", "-w", w, "-c",
                          "paper64-single-region", "-p", tmp_path / "plan.json", "--out",
                          tmp_path / "run.sh", "--json")
    assert code == 0, err
    args, _ = openrlhf_main(json.loads(text)["argv"][3:])
    assert args.actor.model_name_or_path == "meta-llama/Llama-3.1-8B"
    # every built-in model but Megatron-LM's GPTs (no Hugging Face release) and the tiny test
    # models knows its id
    without = {n for n in model_presets() if hf_id(n) is None}
    assert without == {"tiny-qwen3", "tiny-qwen3-moe", "Megatron-GPT-7.1B", "Megatron-GPT-32B",
                       "Megatron-GPT-70B"}


def test_plan_launch_with_openrlhf_exports_as_it_is(capsys, tmp_path, openrlhf_main):
    """`hetrl plan --launch-with openrlhf`: a plan OpenRLHF runs as it is (ratio 1.00), whose
    launch script OpenRLHF's own parser and checks accept."""
    args = ("-w", "qwen3-8b-ppo-sync", "-c", "paper64-multi-region-hybrid")
    code, text, err = run(capsys, "plan", *args, "--budget-evals", "400", "--launch-with",
                          "openrlhf", "-o", tmp_path / "p.json", "--json")
    assert code == 0, err
    code, text, err = run(capsys, "export", "--to", "openrlhf", *args, "-p", tmp_path / "p.json",
                          "--out", tmp_path / "run.sh", "--json")
    assert code == 0, err
    report = json.loads(text)
    assert report["ratio"] == 1.0
    openrlhf_main(report["argv"][3:])


def test_launch_with_openrlhf_refuses_fp8_before_searching(capsys, tmp_path):
    doc = load_workload("qwen3-8b-grpo-sync").to_dict() | {"gen_precision": "fp8"}
    w = _write(tmp_path / "w.yaml", doc)
    code, _, err = run(capsys, "plan", "-w", w, "-c", "paper64-single-region", "--budget-evals",
                       "50", "--launch-with", "openrlhf", "-o", tmp_path / "p.json")
    assert_user_error(code, err, "gen_precision", "fp8", "OpenRLHF")
    assert not (tmp_path / "p.json").exists()
