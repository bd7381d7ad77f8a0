#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from the shared Go
# module (go-shared.sh) through the Go module proxy and caches them outside the repo, keyed by the
# versions the module pins (a new pin of any of its tools can change every library they share).
# Prints the bin directory on stdout's last line. A warm cache rebuilds nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
WORK="$CACHE/work"
# shellcheck source=go-shared.sh
source "$HERE/go-shared.sh"
BIN="$CACHE/bin/control-plane_$SHARED_KEY"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
export GOGC="${GOGC:-$GO_BUILD_GOGC}"

log() { printf '[hack/build] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[hack/build] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "the 'go' command is required to build the test control plane"
mkdir -p "$BIN" "$WORK"
# One build at a time: `make -j` runs this beside hack/build-node.sh, whose kubelet build calls it too.
exec 9>"$BIN/.lock"
flock 9

have() { [ -x "$BIN/$1" ] && [ -f "$BIN/.$1.ok" ]; }
mark() { touch "$BIN/.$1.ok"; }

build() {
  local pkgs=() p
  have kwok && [ -d "$BIN/kwok-stages" ] || pkgs+=(sigs.k8s.io/kwok/cmd/kwok)
  have etcd || pkgs+=(go.etcd.io/etcd/server/v3)
  for p in kube-apiserver kube-controller-manager kube-scheduler; do have "$p" || pkgs+=("k8s.io/kubernetes/cmd/$p"); done
  [ ${#pkgs[@]} -gt 0 ] || return 0
  shared_module || die "resolving the shared Go module failed (see above)"
  # One go build for all: one package graph loaded once, and each link runs while the rest compile.
  # The Kubernetes version stamp (-X) only sets Kubernetes' own variables; kwok and etcd have none.
  log "building ${pkgs[*]} from the shared module; the cold build takes a while"
  shared_build "$BIN" "$KUBERNETES_LDFLAGS" "${pkgs[@]}" || die "building the control plane failed (see above)"
  # etcd's main package is its module's root, go.etcd.io/etcd/server/v3: go names the binary "server".
  if [ -x "$BIN/server" ]; then mv -f "$BIN/server" "$BIN/etcd"; fi
  # The stage configs (node heartbeat, pod lifecycle) ship inside the kwok module.
  local src
  src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@${KWOK_VERSION}/kustomize/stage"
  [ -d "$src" ] || die "kwok stage configs not found at $src"
  rm -rf "$BIN/kwok-stages"; cp -r "$src" "$BIN/kwok-stages"; chmod -R u+w "$BIN/kwok-stages"
  for p in "${pkgs[@]}"; do
    case "$p" in go.etcd.io/*) mark etcd ;; *) mark "${p##*/}" ;; esac
  done
}

start=$(date +%s)
build
log "control plane binaries ready in $BIN ($(( $(date +%s) - start ))s)"
echo "$BIN"
