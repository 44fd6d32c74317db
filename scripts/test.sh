#!/usr/bin/env bash
# The tests, exactly as CI runs them: lint (ruff), types (mypy, strict), then pytest.
# Any arguments go to pytest (e.g. `bash scripts/test.sh tests/cli -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m ruff check kcert tests bench
"$PY" -m mypy
set +e
"$PY" -m pytest -q "$@"
rc=$?
set -e
# pytest's 5 means no test was collected: that is a failure, not a pass.
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit "$rc"
