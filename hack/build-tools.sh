#!/usr/bin/env bash
# Builds helm, promtool (the chart and alert-rule tests need them) and the Prometheus server (the
# real-node tier evaluates the dashboard and the alerts with it) from Go modules through the Go module
# proxy and caches them outside the repo, keyed by version, like build-control-plane.sh.
# Prints the bin directory on stdout's last line. A warm cache rebuilds nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
WORK="$CACHE/work"
# shellcheck source=go-shared.sh
source "$HERE/go-shared.sh"
BIN="$CACHE/bin/tools_${SHARED_KEY}_prometheus-${PROMETHEUS_MODULE_VERSION}"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
export GOGC="${GOGC:-$GO_BUILD_GOGC}"

log() { printf '[hack/build-tools] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[hack/build-tools] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "the 'go' command is required to build helm, promtool and prometheus"
mkdir -p "$BIN"

# One build at a time (make test and a pytest run may both ask); the second waits, then finds it.
exec 9>"$BIN/.lock"
flock 9

have() { [ -x "$BIN/$1" ] && [ -f "$BIN/.$1.ok" ]; }
mark() { touch "$BIN/.$1.ok"; }

start=$(date +%s)
build_helm() {
  have helm && return
  # helm comes from the shared Go module (go-shared.sh); the control plane's build compiles the
  # libraries they share first.
  shared_after_control_plane || die "the control plane build or the shared Go module failed (see above)"
  log "building helm $HELM_VERSION"
  # Like helm's own Makefile: the default Kubernetes version of `helm template` and `helm lint`
  # (Capabilities.KubeVersion) is that of the client-go helm is built with, not v1.20.
  local k8s_minor pkg=helm.sh/helm/v3/pkg
  k8s_minor="$(cd "$SHARED_MOD" && go list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)"
  [ -n "$k8s_minor" ] || die "no k8s.io/client-go in the shared module"
  shared_build "$BIN" "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} \
      -X $pkg/lint/rules.k8sVersionMajor=1 -X $pkg/lint/rules.k8sVersionMinor=$k8s_minor \
      -X $pkg/chartutil.k8sVersionMajor=1 -X $pkg/chartutil.k8sVersionMinor=$k8s_minor" \
    helm.sh/helm/v3/cmd/helm || die "building helm failed (see above)"
  mark helm
}

# promtool and the server come from one Prometheus module: one `go install` of both compiles their
# shared packages (promql, rules, tsdb, the scrape code) once; a cache that has promtool builds only
# what the server adds (its web API, OTLP, the agent mode).
prom=() pkgs=()
for cmd in promtool prometheus; do
  have "$cmd" || { prom+=("$cmd"); pkgs+=("github.com/prometheus/prometheus/cmd/$cmd@${PROMETHEUS_MODULE_VERSION}"); }
done
if [ ${#prom[@]} -gt 0 ]; then
  log "building ${prom[*]} (prometheus module $PROMETHEUS_MODULE_VERSION)"
  # remove_all_sd: Prometheus's own build tag (plugins/plugin_*.go) that leaves out the cloud
  # service-discovery plugins (AWS, Azure, GCE, ...). The rule and alert tests (check rules, test
  # rules) use none of them, nor does the real-node tier's server (static targets), and their SDKs
  # were most of a cold build's time. Without the builtinassets tag the server has no web UI: its
  # HTTP API, all the tests use, is there.
  GOBIN="$BIN" go install -trimpath -gcflags "$GO_GCFLAGS" -tags remove_all_sd -ldflags "-s -w" \
    "${pkgs[@]}" \
    || die "building ${prom[*]} failed (see above)"
  for cmd in "${prom[@]}"; do mark "$cmd"; done
fi
# After Prometheus (its own module, nothing shared): helm waits for the control plane's build.
build_helm
log "helm, promtool and prometheus ready in $BIN ($(( $(date +%s) - start ))s)"
echo "$BIN"
