#!/usr/bin/env bash
# Builds helm and promtool (the chart and alert-rule tests need them) from Go modules through the
# Go module proxy and caches them outside the repo, keyed by version, like build-control-plane.sh.
# Prints the bin directory on stdout's last line. A warm cache rebuilds nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
BIN="$CACHE/bin/tools_helm-${HELM_VERSION}_prometheus-${PROMETHEUS_MODULE_VERSION}"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0

log() { printf '[hack/build-tools] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[hack/build-tools] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "the 'go' command is required to build helm and promtool"
mkdir -p "$BIN"

# One build at a time (make test and a pytest run may both ask); the second waits, then finds it.
exec 9>"$BIN/.lock"
flock 9

have() { [ -x "$BIN/$1" ] && [ -f "$BIN/.$1.ok" ]; }
mark() { touch "$BIN/.$1.ok"; }

start=$(date +%s)
if ! have helm; then
  log "building helm $HELM_VERSION"
  # Like helm's own Makefile: the default Kubernetes version of `helm template` and `helm lint`
  # (Capabilities.KubeVersion) is that of the client-go helm is built with, not v1.20.
  gomod="$(go mod download -json "helm.sh/helm/v3@${HELM_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  [ -f "$gomod" ] || die "could not download helm.sh/helm/v3@${HELM_VERSION}"
  k8s_minor="$(awk '$1=="k8s.io/client-go"{split($2,v,"."); print v[2]}' "$gomod")"
  [ -n "$k8s_minor" ] || die "no k8s.io/client-go in helm's go.mod"
  pkg=helm.sh/helm/v3/pkg
  GOBIN="$BIN" go install -trimpath -gcflags "$GO_GCFLAGS" \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} \
      -X $pkg/lint/rules.k8sVersionMajor=1 -X $pkg/lint/rules.k8sVersionMinor=$k8s_minor \
      -X $pkg/chartutil.k8sVersionMajor=1 -X $pkg/chartutil.k8sVersionMinor=$k8s_minor" \
    "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" || die "building helm failed (see above)"
  mark helm
fi
if ! have promtool; then
  log "building promtool (prometheus module $PROMETHEUS_MODULE_VERSION)"
  # remove_all_sd: Prometheus's own build tag (plugins/plugin_*.go) that leaves out the cloud
  # service-discovery plugins (AWS, Azure, GCE, ...). The rule and alert tests (check rules, test
  # rules) use none of them, and their SDKs were most of a cold build's time.
  GOBIN="$BIN" go install -trimpath -gcflags "$GO_GCFLAGS" -tags remove_all_sd -ldflags "-s -w" \
    "github.com/prometheus/prometheus/cmd/promtool@${PROMETHEUS_MODULE_VERSION}" \
    || die "building promtool failed (see above)"
  mark promtool
fi
log "helm and promtool ready in $BIN ($(( $(date +%s) - start ))s)"
echo "$BIN"
