#!/usr/bin/env bash
# Fresh machine -> a virtual environment with kcert, then the main job on the
# embedded defaults: lint every example, certify one on the CPU, verify it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch 2.13.0 first: on these machines it resolves to the CPU build already on disk.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e '.[triton,test]'
bash scripts/demo.sh
