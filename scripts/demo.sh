#!/usr/bin/env bash
# The main job on the embedded defaults: no GPU and no server needed.
# Lints every example with NVRTC, certifies a Triton example on the CPU,
# signs and verifies it, then takes it through the embedded registry and
# audits the log. State goes to a throw-away KCERT_HOME unless one is set.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export KCERT_HOME="${KCERT_HOME:-$(mktemp -d -t kcert-demo.XXXXXX)}"
step() { printf '\n== %s\n' "$*" >&2; }

step "kcert lint: every example, built with NVRTC for sm_90 (no GPU needed)"
kcert lint examples/cuda
kcert lint examples/triton

step "kcert keys generate"
kcert keys generate --out "$KCERT_HOME/signing.key"

step "kcert certify: the Triton saxpy on the CPU through the Triton interpreter"
kcert certify examples/triton/kcert.toml --kernel saxpy --executor triton-interpreter --hw cpu \
  --key "$KCERT_HOME/signing.key" --out "$KCERT_HOME/saxpy.cert.json"

step "kcert verify"
kcert verify "$KCERT_HOME/saxpy.cert.json" --key "$KCERT_HOME/signing.key.pub"

step "the embedded registry: trust, push, target, promote, gate"
kernel=$(kcert verify "$KCERT_HOME/saxpy.cert.json" --key "$KCERT_HOME/signing.key.pub" --json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["source_digest"])')
kcert keys trust "$KCERT_HOME/signing.key.pub" --name demo
kcert push "$KCERT_HOME/saxpy.cert.json"
kcert target report demo-fleet --hw cpu
json_field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
granted=$(kcert promote --kernel "$kernel" --target demo-fleet --json | json_field log_index)
kcert gate --kernel "$kernel" --target demo-fleet

step "drift: the fleet reports a different environment; the gate now denies"
kcert fingerprint --json | python3 -c '
import json, sys
env = json.load(sys.stdin)["environment"]
env["numpy"] = "0.0.0-drifted"
json.dump(env, open(sys.argv[1], "w"))' "$KCERT_HOME/drifted.json"
kcert target report demo-fleet --hw cpu --environment "$KCERT_HOME/drifted.json"
if kcert gate --kernel "$kernel" --target demo-fleet; then
  echo "demo: the gate allowed a kernel after drift" >&2; exit 1
fi
# Promoting again is refused (exit 1) until the kernel is certified for the new environment.
denied=$(kcert promote --kernel "$kernel" --target demo-fleet --json | json_field log_index || true)
[ -n "$denied" ] || { echo "demo: promotion after drift was not refused" >&2; exit 1; }

step "the audit log: verify every entry against the signed checkpoint, replay a decision"
kcert audit verify --trust-on-first-use
kcert audit replay "$granted"
kcert audit replay "$denied"
echo
echo "demo: done; state in KCERT_HOME=$KCERT_HOME" >&2
