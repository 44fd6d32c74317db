#!/usr/bin/env bash
# The main job on the embedded defaults (no GPU, no server needed).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "demo: (filled in as the examples land)"
