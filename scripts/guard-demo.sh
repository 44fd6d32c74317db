#!/usr/bin/env bash
# The loop after promotion, on the CPU: certify, promote, serve traffic through the
# guard, a mismatch, the gate denies, and the audit log explains why.
# The kernel (tests/assets/guard) is right on every size its spec probes and wrong
# past 16384 elements: it certifies, and only production traffic shows the bug.
# A registry server runs on a local port with a throw-away KCERT_HOME.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export KCERT_HOME="${KCERT_HOME:-$(mktemp -d -t kcert-guard-demo.XXXXXX)}"
step() { printf '\n== %s\n' "$*" >&2; }
json_field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
spec=tests/assets/guard/kcert.toml
target=prod-a

step "kcert certify: a saxpy that is wrong only past 16384 elements (its probes stop at 4097)"
kcert keys generate --out "$KCERT_HOME/signing.key" 2>/dev/null
kcert certify "$spec" --executor triton-interpreter --hw cpu \
  --key "$KCERT_HOME/signing.key" --out "$KCERT_HOME/saxpy_large.cert.json"
kernel=$(kcert verify "$KCERT_HOME/saxpy_large.cert.json" --key "$KCERT_HOME/signing.key.pub" \
  --json | json_field source_digest)

step "kcert serve: a registry on a local port"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export KCERT_ADMIN_TOKEN="kcert_demo_admin_$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
kcert serve --port "$port" 2>"$KCERT_HOME/serve.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
export KCERT_REGISTRY="http://127.0.0.1:$port" KCERT_TOKEN="$KCERT_ADMIN_TOKEN"
for _ in $(seq 100); do curl -fs "$KCERT_REGISTRY/v1/log/checkpoint" >/dev/null && break; sleep 0.2; done

step "trust, push, report the target, set its policy (a confirmed mismatch suspends), promote"
kcert keys trust "$KCERT_HOME/signing.key.pub" --name demo
kcert push "$KCERT_HOME/saxpy_large.cert.json"
kcert target report "$target" --hw cpu
kcert target policy "$target" --on-mismatch suspend
kcert promote --kernel "$kernel" --target "$target"
kcert gate --kernel "$kernel" --target "$target"

step "a token for the guard: observations:write only"
guard_token=$(kcert token create --scope observations:write --json | json_field token)

step "serve traffic through kcert.guard (Triton interpreter, torch CPU tensors)"
TRITON_INTERPRET=1 GUARD_TOKEN="$guard_token" python3 - "$KCERT_HOME/saxpy_large.cert.json" "$spec" <<'PY'
import importlib.util, os, sys
import numpy as np, torch, triton
from kcert.guard import Guard, HttpReporter

cert, spec = sys.argv[1], sys.argv[2]
loaded = importlib.util.spec_from_file_location("saxpy_large", "tests/assets/guard/saxpy_large.py")
module = importlib.util.module_from_spec(loaded)
loaded.loader.exec_module(module)

def launch(x_ptr, y_ptr, a, n):
    module.saxpy[(triton.cdiv(n, 1024),)](x_ptr, y_ptr, a, n, BLOCK=1024)

reporter = HttpReporter(os.environ["KCERT_REGISTRY"], os.environ["GUARD_TOKEN"], "prod-a")
# Every call is checked here, to keep the demo short and certain; in production a rate
# such as 0.01 samples calls at random (and the outlier detector adds unusual ones).
guard = Guard.from_certificate(cert, spec, sample_rate=1.0, seed=0, reporter=reporter)
serve = guard.wrap(launch)
rng = np.random.default_rng(0)
for n in (1000, 3000, 4097, 2048, 20000):
    x, y = (torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
    serve(x, y, 2.5, n)
    print(f"served a call with n={n}")
guard.flush(120)
s = guard.stats()
print(f"guard: {s.calls_seen} calls seen, {s.calls_sampled} sampled, {s.calls_checked} checked, "
      f"{s.mismatches} mismatch(es), {s.out_of_scope} out of the certified scope")
guard.close()
PY

step "the gate now denies: the promotion is suspended by a runtime mismatch"
if kcert gate --kernel "$kernel" --target "$target"; then
  echo "demo: the gate still allowed the kernel" >&2; exit 1
fi

step "kcert audit replay: the mismatch's action follows from its inputs; its evidence re-checked"
index=$(curl -fs "$KCERT_REGISTRY/v1/log/entries?start=0&end=1000" | python3 -c '
import base64, json, sys
entries = json.load(sys.stdin)["entries"]
print([e["index"] for e in entries
       if json.loads(base64.b64decode(e["leaf"]))["kind"] == "observation.mismatch"][0])')
kcert audit verify --trust-on-first-use
kcert audit replay "$index" --spec "$spec"
kcert audit replay --all
echo
echo "demo: done; state in KCERT_HOME=$KCERT_HOME" >&2
