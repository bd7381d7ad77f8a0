#!/usr/bin/env bash
# Smoke test of gpuhealth-agent against the real NVIDIA driver on this machine (no cluster).
#
#   1. discover + sample once through the system libnvidia-ml.so.1 and print the report spec
#      (gpuhealth-agent --once --dry-run), then sanity-check it;
#   2. register for XID events on every GPU and wait once (the event path must not error);
#   3. run the agent's threads for a few seconds with the print transport and scrape /metrics;
#   4. say whether the validation tools (dcgmi, a DCGM hostengine) would be found; never run them.
#
# It only reads: it never changes a GPU setting (no persistence, clocks, ECC or MIG mode) and
# never resets a GPU; the agent it runs uses NVML's query and event calls only.
#
# Python (3.11 or newer, as the package requires): $PYTHON, else .venv/bin/python, else python3,
# each only if it can import the agent (gpuhealth.agent.main with everything it imports) from this
# checkout; else a throwaway venv under a temp dir with this package installed into it
# (pip install ., so its dependencies are pyproject.toml's, not a list kept here).
# SMOKE_FRESH_VENV=1 skips straight to the throwaway venv (what a clean clone gets).
# Output goes to $SMOKE_OUT (default: a temp dir).
#
# Exit status:
#   0  PASS: NVML answered and every check passed;
#   1  FAIL: a check failed, or no usable Python / the install failed;
#   2  NVML unavailable: the agent ran and reported nvml.available=false (no driver, no GPU, or
#      the library did not load); the last line says "RESULT: NVML unavailable: <error>".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${SMOKE_OUT:-$(mktemp -d -t gpuhealth-smoke.XXXXXX)}
mkdir -p "$OUT"
NODE=${NODE_NAME:-$(hostname)}
PORT=${SMOKE_METRICS_PORT:-19401}
# The real driver, never a fake left over from a test shell.
unset GPUHEALTH_NVML_LIBRARY FAKE_NVML_SCENARIO

say() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
new_enough='import sys; assert sys.version_info >= (3, 11)'
# Usable: new enough and able to import the agent's whole import chain from this checkout.
usable() {
    [[ -x "$1" || -n $(command -v "$1" 2>/dev/null) ]] &&
        PYTHONPATH="$ROOT/operator${PYTHONPATH:+:$PYTHONPATH}" "$1" -c "$new_enough; import gpuhealth.agent.main" 2>/dev/null
}

if [[ -n ${PYTHON:-} ]]; then
    PY=$PYTHON
    usable "$PY" || fail "\$PYTHON=$PY is older than 3.11 or cannot import gpuhealth.agent.main"
    export PYTHONPATH="$ROOT/operator${PYTHONPATH:+:$PYTHONPATH}"
elif [[ -z ${SMOKE_FRESH_VENV:-} ]] && usable "$ROOT/.venv/bin/python"; then
    PY=$ROOT/.venv/bin/python
    export PYTHONPATH="$ROOT/operator${PYTHONPATH:+:$PYTHONPATH}"
elif [[ -z ${SMOKE_FRESH_VENV:-} ]] && usable python3; then
    PY=python3
    export PYTHONPATH="$ROOT/operator${PYTHONPATH:+:$PYTHONPATH}"
else
    BASE=""
    for candidate in python3 python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "$new_enough" 2>/dev/null; then
            BASE=$candidate
            break
        fi
    done
    [[ -n $BASE ]] || fail "no Python 3.11 or newer on PATH (gpuhealth needs it)"
    VENV=$(mktemp -d -t gpuhealth-smoke-venv.XXXXXX)  # used once and removed: no .pyc compiled up front (--no-compile)
    trap 'rm -rf "$VENV"' EXIT
    say "throwaway venv ($BASE -m venv; pip install $ROOT)"
    "$BASE" -m venv "$VENV" || fail "cannot create a venv with $BASE"
    "$VENV/bin/pip" install -q --no-compile --disable-pip-version-check "$ROOT" || fail "pip install $ROOT failed"
    PY=$VENV/bin/python
    # The installed package, not the checkout: this is what a clean clone runs.
    unset PYTHONPATH
    "$PY" -c "import gpuhealth.agent.main" || fail "the installed package cannot import its agent"
fi

say "host"
echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0])') ($PY)"
echo "nvidia-ml-py: $("$PY" -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))' 2>/dev/null || echo '?')"
EXPECTED=""
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt" || true
    EXPECTED=$(grep -c '^GPU ' "$OUT/nvidia-smi-L.txt" || true)
    nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,temperature.gpu,ecc.mode.current,mig.mode.current \
        --format=csv,noheader 2>/dev/null | tee "$OUT/nvidia-smi-query.csv" || true
fi

say "report (gpuhealth-agent --once --dry-run)"
set +e
"$PY" -m gpuhealth.agent.main --once --dry-run --node-name "$NODE" --metrics-port 0 \
    >"$OUT/report.json" 2>"$OUT/report.log"
rc=$?
set -e
cat "$OUT/report.json"
cat "$OUT/report.log" >&2
if [[ $rc -eq 3 ]]; then
    # The agent's own convention: it ran, sampled, and NVML was not there. Not a crash.
    "$PY" - "$OUT/report.json" <<'PY' || fail "agent exited 3 but its report says NVML is available"
import json, sys
spec = json.load(open(sys.argv[1]))
assert spec["nvml"]["available"] is False and not spec["devices"], spec
print(f"RESULT: NVML unavailable: {spec['nvml'].get('error')}")
PY
    exit 2
fi
[[ $rc -eq 0 ]] || fail "agent exited $rc (see $OUT/report.log)"

say "checks"
"$PY" - "$OUT/report.json" "$EXPECTED" "$OUT/nvidia-smi-query.csv" <<'PY'
import csv, json, os, sys

spec = json.load(open(sys.argv[1]))
expected = int(sys.argv[2]) if sys.argv[2] else None
problems = []
if not spec["nvml"]["available"]:
    problems.append(f"NVML unavailable: {spec['nvml'].get('error')}")
devices = spec["devices"]
if not devices:
    problems.append("no devices")
if expected is not None and len(devices) != expected:
    problems.append(f"{len(devices)} devices, nvidia-smi lists {expected}")
smi = {}
if os.path.exists(sys.argv[3]):
    for row in csv.reader(open(sys.argv[3])):
        if row:
            smi[int(row[0])] = [c.strip() for c in row]
for d in devices:
    for key in ("uuid", "pciBusId", "model", "migMode", "eccMode", "temperature"):
        if key not in d:
            problems.append(f"GPU {d['index']}: no {key}")
    if d.get("lost"):
        problems.append(f"GPU {d['index']} is lost")
    row = smi.get(d["index"])
    if row and row[1] != d.get("uuid"):
        problems.append(f"GPU {d['index']}: uuid {d.get('uuid')} != nvidia-smi {row[1]}")
    print(
        f"GPU {d['index']} {d.get('model')} {d.get('uuid')} {d.get('pciBusId')} "
        f"temp={d.get('temperature')} ecc={d.get('ecc')} remap={d.get('remappedRows')} "
        f"clock=0x{d.get('clockEventReasons', 0):x} power={d.get('powerW')} "
        f"recovery={d.get('recoveryAction')} mig={d.get('migMode')} unsupported={d.get('unsupported', [])}"
    )
    # The fabric between GPUs (docs/agent.md): printed, never judged here (a lone PCIe GPU has none).
    print(
        f"  nvlink={d.get('nvlink')} fabric={d.get('fabric')} pcie={d.get('pcie')} clocks={d.get('clocks')}"
    )
print(f"driver {spec['nvml'].get('driverVersion')} CUDA {spec['nvml'].get('cudaVersion')}")
if problems:
    sys.exit("FAIL: " + "; ".join(problems))
print("report OK")
PY

say "XID event path (register + one bounded wait)"
"$PY" - <<'PY'
import logging, time
logging.basicConfig(level=logging.INFO)
from gpuhealth.agent.nvml_source import NvmlSource

src = NvmlSource()
src.open()
start = time.monotonic()
batch = src.wait_events(2.0)  # first call creates the event set and registers every GPU
took = time.monotonic() - start
sample = src.sample()
unsupported = [d.index for d in sample.devices if "xidEvents" in d.unsupported]
print(f"wait returned after {took:.2f}s with {len(batch.xids)} XID(s); XID events unsupported on {unsupported}")
src.close()
if unsupported:
    raise SystemExit("FAIL: XID events not available on some GPUs")
PY

say "agent threads for a few seconds (print transport) + /metrics"
"$PY" -m gpuhealth.agent.main --dry-run --node-name "$NODE" --interval 1 --heartbeat-interval 2 \
    --metrics-port "$PORT" --metrics-bind 127.0.0.1 >"$OUT/writes.jsonl" 2>"$OUT/agent.log" &
AGENT=$!
sleep 5
"$PY" - "$PORT" "$OUT/metrics.txt" <<'PY'
import sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
open(sys.argv[2], "w").write(text)
health = urllib.request.urlopen(f"{base}/healthz", timeout=5).read().decode().strip()
temps = [l for l in text.splitlines() if l.startswith("gpuhealth_agent_gpu_temperature_celsius{")]
print("healthz:", health)
print("\n".join(temps))
if health != "ok" or not temps:
    raise SystemExit("FAIL: /healthz or per-GPU metrics missing")
PY
kill -INT "$AGENT"
wait "$AGENT" || { echo "FAIL: agent did not stop cleanly" >&2; exit 1; }
echo "writes: $(grep -c '"op": "create"' "$OUT/writes.jsonl") create, $(grep -c '"op": "patch"' "$OUT/writes.jsonl") patch"

say "validation tools (found or not; a diagnostic is never run here, docs/remediation.md)"
# A validation Job (spec.validation) runs `dcgmi diag` against the node-local DCGM hostengine; this
# only says whether this host would have them: the binaries on PATH and a hostengine on port 5555.
for tool in dcgmi nv-hostengine; do
    if command -v "$tool" >/dev/null 2>&1; then echo "$tool: $(command -v "$tool")"; else echo "$tool: not found"; fi
done
if timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5555' 2>/dev/null; then
    echo "DCGM hostengine: listening on 127.0.0.1:5555"
else
    echo "DCGM hostengine: nothing on 127.0.0.1:5555"
fi

say "PASS (artifacts in $OUT)"
