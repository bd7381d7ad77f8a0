#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from
# Go modules through the Go module proxy and caches them outside the repo, keyed by version.
# Prints the bin directory on stdout's last line. A warm cache rebuilds nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
BIN="$CACHE/bin/k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
WORK="$CACHE/work"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { printf '[hack/build] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[hack/build] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "the 'go' command is required to build the test control plane"
mkdir -p "$BIN" "$WORK"
# One build at a time: `make -j` runs this beside hack/build-node.sh, whose kubelet build calls it too.
exec 9>"$BIN/.lock"
flock 9

have() { [ -x "$BIN/$1" ] && [ -f "$BIN/.$1.ok" ]; }
mark() { touch "$BIN/.$1.ok"; }

build_kwok() {
  if have kwok && [ -d "$BIN/kwok-stages" ]; then return; fi
  log "building kwok $KWOK_VERSION"
  GOBIN="$BIN" go install -trimpath -gcflags "$GO_GCFLAGS" -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" \
    || die "building kwok failed (see above)"
  # The stage configs (node heartbeat, pod lifecycle) ship inside the kwok module.
  local src
  src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@${KWOK_VERSION}/kustomize/stage"
  [ -d "$src" ] || die "kwok stage configs not found at $src"
  rm -rf "$BIN/kwok-stages"; cp -r "$src" "$BIN/kwok-stages"; chmod -R u+w "$BIN/kwok-stages"
  mark kwok
}

build_etcd() {
  if have etcd; then return; fi
  log "building etcd $ETCD_VERSION (wrapper module; go install refuses its replace directives)"
  local mod="$WORK/etcd-$ETCD_VERSION"
  mkdir -p "$mod"
  cat > "$mod/go.mod" <<GOMOD
module gpuhealth.dev/hack/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
GOMOD
  local ver="${ETCD_VERSION#v}"
  for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do
    echo "replace go.etcd.io/etcd/$m => go.etcd.io/etcd/$m v$ver" >> "$mod/go.mod"
  done
  (cd "$mod" && go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >&2 \
     && go build -trimpath -gcflags "$GO_GCFLAGS" -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3) \
    || die "building etcd failed (see above)"
  mark etcd
}

build_kubernetes() {
  if have kube-apiserver && have kube-controller-manager && have kube-scheduler; then return; fi
  log "building Kubernetes $KUBERNETES_VERSION (apiserver, controller-manager, scheduler); the cold build takes a while"
  local mod="$WORK/kubernetes-$KUBERNETES_VERSION" minor staging_ver gomod
  minor="${KUBERNETES_VERSION#v1.}"
  staging_ver="v0.${minor}"
  mkdir -p "$mod"
  gomod="$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  [ -f "$gomod" ] || die "could not download k8s.io/kubernetes@${KUBERNETES_VERSION}"
  {
    echo "module gpuhealth.dev/hack/kubernetes"
    echo
    echo "go $(sed -n 's/^go //p' "$gomod")"
    grep '^godebug' "$gomod" || true
    echo
    echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
    echo
    echo "replace ("
    # Staging modules that k8s.io/kubernetes requires at v0.0.0 and replaces with ./staging paths.
    local required
    required="$(awk '$2=="v0.0.0"{print $1}' "$gomod" | sort -u)"
    sed -n '/^replace (/,/^)/p' "$gomod" | awk '/=> \.\/staging/{print $1}' | sort -u \
      | comm -12 - <(echo "$required") \
      | while read -r m; do echo "	$m => $m ${staging_ver}"; done
    echo ")"
  } > "$mod/go.mod"
  log "wrapper module: $(grep -c '=>' "$mod/go.mod") staging replaces"
  local pkgs="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler"
  # shellcheck disable=SC2086
  (cd "$mod" && go get $pkgs >&2) || die "resolving Kubernetes modules failed (see above)"
  # One go build for the three: one package graph loaded once, and one link runs while the rest compile.
  log "  go build $pkgs"
  # shellcheck disable=SC2086
  (cd "$mod" && go build -trimpath -gcflags "$GO_GCFLAGS" -ldflags "$KUBERNETES_LDFLAGS" -o "$BIN/" $pkgs) \
    || die "building Kubernetes failed (see above)"
  for p in $pkgs; do mark "${p##*/}"; done
}

start=$(date +%s)
build_kwok
build_etcd
build_kubernetes
log "control plane binaries ready in $BIN ($(( $(date +%s) - start ))s)"
echo "$BIN"
