#!/usr/bin/env bash
# Everything that needs a GPU, in one run, with its evidence under $OUT:
#
#   1. timing fidelity, alone on the device: bench/timing.py (kcert vs
#      triton.testing.do_bench) and tests/certify/test_timing_gpu.py;
#   2. side by side: every `gpu` test; every example of examples/cuda and
#      examples/triton certified with --hw, signed and verified, then a CUDA and a
#      Triton certificate pushed, promoted and re-run with `audit replay --rerun`;
#      the CUDA adversarial race and uninitialised read (and a correct kernel)
#      certified with --sanitize memcheck,racecheck,initcheck.
#
# From the repository root of a GPU machine (CuPy, Triton, torch and pytest on
# its python3; the other dependencies as wheels in .devgpu/whl, which
# gpu-prep.sh in the team's shared tools makes on a machine with network):
#
#   OUT=logs bash scripts/gpu-verify.sh [HW_CLASS]      # HW_CLASS defaults to H100
#
# $OUT then holds env.txt, timing.log, pytest.log, junit.xml, examples.log,
# sanitizer.log (each run's sanitizer check) and sanitizer.tgz (the tools' raw
# reports and the certificates). The exit status is 0 only when every step met its bar.
set -uo pipefail
export PYTHONUNBUFFERED=1
HW=${1:-H100}
OUT=${OUT:-.devgpu/out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
if [ -d .devgpu/whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .devgpu/whl/*.whl || exit 3
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
work=$(mktemp -d -t kcert-gpu.XXXXXX)
export KCERT_HOME="$work/home"
mkdir -p "$KCERT_HOME" "$work/certs" "$work/sanitizer"
kcert() {  # one CLI call, never longer than 200 s
  timeout 200 python3 -c 'import sys; from kcert.cli import main; sys.argv[0] = "kcert"; main()' "$@"
}
field() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
failures=0
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
  nvidia-smi | sed -n 1,4p
  python3 --version
  python3 -c 'import cupy, numpy, torch, triton; print("cupy", cupy.__version__, "numpy",
numpy.__version__, "torch", torch.__version__, "triton", triton.__version__)'
  "$SAN" --version
  "$SAN" --help
} > "$OUT/env.txt" 2>&1

# ---- 1. timing, with nothing else on the device
{
  echo "== bench/timing.py"
  timeout 120 python3 bench/timing.py || fail "bench/timing.py"
  echo "== tests/certify/test_timing_gpu.py"
  timeout 90 python3 -m pytest -q -rs -s -p no:cacheprovider tests/certify/test_timing_gpu.py \
    || fail "test_timing_gpu.py"
} > "$OUT/timing.log" 2>&1
cat "$OUT/timing.log"
kcert keys generate --out "$KCERT_HOME/signing.key" >/dev/null || fail "keys generate"

# ---- 2a. every gpu test
( timeout 330 python3 -m pytest -q -rs -m gpu --continue-on-collection-errors -p no:cacheprovider \
    --ignore=tests/certify/test_timing_gpu.py --junitxml="$OUT/junit.xml" \
    > "$OUT/pytest.log" 2>&1; echo "pytest exit $?" >> "$OUT/pytest.log" ) &
tests=$!

# ---- 2b. the examples: certify with --hw, sign, verify; replay --rerun
examples() {
  local lang name cert
  for lang in cuda triton; do
    for name in saxpy row_sum softmax matmul layernorm row_max; do
      cert="$work/certs/$lang-$name.cert.json"
      echo "== certify examples/$lang $name --hw $HW"
      kcert certify "examples/$lang/kcert.toml" --kernel "$name" --hw "$HW" \
        --key "$KCERT_HOME/signing.key" --out "$cert" --json > "$work/$lang-$name.json"
      echo "exit $?"
      python3 - "$work/$lang-$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"verdict {r['verdict']} executor {r['executor']} hw {r['hw_class']} probes {r['probes']}")
for c in r["checks"]:
    if c["status"] != "pass" or c["name"] == "timing":
        print(f"  {c['name']}: {c['status']} {c['message'][:300]}")
PY
      kcert verify "$cert" --key "$KCERT_HOME/signing.key.pub" --require-pass --json \
        | python3 -c 'import json,sys; r=json.load(sys.stdin); print("verify valid", r["valid"], r.get("verdict"))' \
        || fail "verify $lang $name"
    done
  done
  echo "== registry: trust, push, target, promote, audit verify, audit replay --rerun"
  kcert keys trust "$KCERT_HOME/signing.key.pub" --name gpu >/dev/null || fail "keys trust"
  kcert target report "fleet-$HW" --hw "$HW" >/dev/null || fail "target report"
  local lang digest index
  for lang in cuda triton; do
    cert="$work/certs/$lang-saxpy.cert.json"
    kcert push "$cert" >/dev/null || fail "push $lang"
    digest=$(kcert verify "$cert" --key "$KCERT_HOME/signing.key.pub" --json | field source_digest)
    index=$(kcert promote --kernel "$digest" --target "fleet-$HW" --json | field log_index)
    kcert audit verify --trust-on-first-use || fail "audit verify"
    echo "-- audit replay $index --rerun ($lang saxpy)"
    kcert audit replay "$index" --rerun --spec "examples/$lang/kcert.toml" --kernel saxpy \
      || fail "replay --rerun $lang"
  done
}
( examples > "$OUT/examples.log" 2>&1; echo "examples: $failures failure(s)" >> "$OUT/examples.log" ) &
runs=$!

# ---- 2c. compute-sanitizer on the race, the uninitialised read and a correct kernel
sanitize() {
  local name
  for name in row_sum_race neighbor_sum_uninit_smem row_sum; do
    echo "== certify tests/assets/cuda $name --sanitize memcheck,racecheck,initcheck"
    KCERT_HOME="$work/home-sanitizer" KCERT_SANITIZER_LOGS="$work/sanitizer/$name" kcert certify tests/assets/cuda/kcert.toml \
      --kernel "$name" --hw "$HW" --sanitize memcheck,racecheck,initcheck \
      --key "$KCERT_HOME/signing.key" --out "$work/sanitizer/$name.cert.json" --json \
      > "$work/sanitizer/$name.json"
    echo "exit $?"
    python3 - "$work/sanitizer/$name.cert.json" <<'PY'
import base64, json, sys
envelope = json.load(open(sys.argv[1]))
statement = json.loads(base64.b64decode(envelope["payload"]))
for check in statement["predicate"]["checks"]:
    if check["name"] in ("sanitizer", "correctness", "determinism"):
        print(f"  {check['name']}: {check['status']} {check['message'][:400]}")
    if check["name"] == "sanitizer":
        print(json.dumps(check["details"], indent=1)[:6000])
PY
  done
}
( sanitize > "$OUT/sanitizer.log" 2>&1 ) &
san=$!

wait "$tests" "$runs" "$san"
tar -C "$work" -czf "$OUT/sanitizer.tgz" sanitizer
grep -q "pytest exit 0" "$OUT/pytest.log" || fail "gpu tests"
grep -q "examples: 0 failure" "$OUT/examples.log" || fail "examples"
tail -3 "$OUT/pytest.log"
echo "gpu-verify: $failures failure(s); logs in $OUT"
[ "$failures" -eq 0 ]
