#!/usr/bin/env bash
# Builds Kueue's manager (cmd/kueue) from its Go module through the Go module proxy, with the CRDs
# and webhook configurations of the very same module, and caches them outside the repo, keyed by
# version, like build-control-plane.sh. The Kueue tests (devkit/kueue.py) run it beside the
# local control plane. Prints the directory on stdout's last line. A warm cache rebuilds nothing.
#
# One substitution, checked to match exactly once: with internal cert management off, Kueue
# v0.17 reads its metrics certificate from the fixed path /etc/kueue/metrics/certs (where a
# cert-manager Secret is mounted in a real install). The build reads that path from
# KUEUE_METRICS_CERT_DIR instead (same default), through `go build -overlay`, so a test run writes
# nothing under /etc. The module itself is not touched; nothing else in the manager changes.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
OUT="$CACHE/bin/kueue-${KUEUE_VERSION}"
WORK="$CACHE/work/kueue-${KUEUE_VERSION}"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
export GOGC="${GOGC:-$GO_BUILD_GOGC}"

log() { printf '[hack/build-kueue] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[hack/build-kueue] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "the 'go' command is required to build Kueue"
mkdir -p "$OUT" "$WORK"

# One build at a time (make test and a pytest run may both ask); the second waits, then finds it.
exec 9>"$OUT/.lock"
flock 9

if [ -x "$OUT/kueue" ] && [ -f "$OUT/.kueue.ok" ] && [ -d "$OUT/crds" ] && [ -f "$OUT/webhooks.yaml" ]; then
  echo "$OUT"
  exit 0
fi

start=$(date +%s)
log "building Kueue $KUEUE_VERSION (manager, CRDs, webhook configurations)"
dir="$(go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')"
[ -d "$dir" ] || die "could not download sigs.k8s.io/kueue@${KUEUE_VERSION}"

main="$dir/cmd/kueue/main.go"
literal='metricsCertPath := "/etc/kueue/metrics/certs"'
[ "$(grep -cF "$literal" "$main")" = 1 ] \
  || die "expected exactly one '$literal' in $main; revisit this script for Kueue $KUEUE_VERSION"
sed "s|$literal|metricsCertPath := gpuhealthMetricsCertDir()|" "$main" > "$WORK/main.go"
cat >> "$WORK/main.go" <<'GO'

// gpuhealthMetricsCertDir: added by gpuhealth's hack/build-kueue.sh (tests run without /etc access).
func gpuhealthMetricsCertDir() string {
	if d := os.Getenv("KUEUE_METRICS_CERT_DIR"); d != "" {
		return d
	}
	return "/etc/kueue/metrics/certs"
}
GO
printf '{"Replace": {"%s": "%s"}}\n' "$main" "$WORK/main.go" > "$WORK/overlay.json"

# Built in a copy of the module (go refuses an overlay of files in the module cache), so its own
# go.mod and go.sum pin every dependency exactly as Kueue's release does.
src="$WORK/src"
if [ ! -f "$src/.copied" ]; then
  rm -rf "$src"; mkdir -p "$src"
  cp -r "$dir/." "$src/"; chmod -R u+w "$src"; touch "$src/.copied"
fi
sed "s|$main|$src/cmd/kueue/main.go|" "$WORK/overlay.json" > "$WORK/overlay-src.json"
(cd "$src" && GOFLAGS=-mod=readonly go build -trimpath -gcflags "$GO_GCFLAGS" -overlay "$WORK/overlay-src.json" \
   -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}" \
   -o "$OUT/kueue" ./cmd/kueue) || die "building Kueue failed (see above)"

rm -rf "$OUT/crds"; mkdir -p "$OUT/crds"
cp "$dir"/config/components/crd/bases/*.yaml "$OUT/crds/"
cp "$dir/config/components/webhook/manifests.yaml" "$OUT/webhooks.yaml"
chmod -R u+w "$OUT/crds" "$OUT/webhooks.yaml"
touch "$OUT/.kueue.ok"
log "Kueue $KUEUE_VERSION ready in $OUT ($(( $(date +%s) - start ))s)"
echo "$OUT"
