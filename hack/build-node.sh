#!/usr/bin/env bash
# Builds what the real node of tests/integration/test_real_node.py runs, from Go modules and
# Debian packages only (nothing prebuilt is downloaded), cached outside the repo keyed by version
# like build-control-plane.sh:
#   - containerd, ctr and containerd-shim-runc-v2, and the kubelet, from the shared Go module
#     (go-shared.sh) the control plane is built from;
#   - registry.k8s.io/pause (containerd's default sandbox image), a FROM-scratch image holding a
#     small static pause binary compiled here, saved as an archive for `ctr images import`.
# runc, the CNI plugins, nftables and podman come from Debian (install-node-packages.sh).
# Arguments name the pieces to build (containerd, pause, kubelet); none builds all.
# Prints the bin directory on stdout's last line. A warm cache rebuilds nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
WORK="$CACHE/work"
# shellcheck source=go-shared.sh
source "$HERE/go-shared.sh"
BIN="$CACHE/bin/node_$SHARED_KEY"
# Podman keeps its storage under the cache too (never the host's /var/lib/containers).
# By its physical path: podman records its storage path and refuses the same storage reached
# another way (a symlinked cache, or GPUHEALTH_CACHE naming it through a link).
STORE="$(mkdir -p "$CACHE/podman" && cd "$CACHE/podman" && pwd -P)"
PODMAN=(podman --root "$STORE/storage" --runroot "$STORE/run")
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
export GOGC="${GOGC:-$GO_BUILD_GOGC}"

log() { printf '[hack/build-node] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[hack/build-node] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "the 'go' command is required to build containerd and the kubelet"
mkdir -p "$BIN" "$WORK"
exec 9>"$BIN/.lock"
flock 9

have() { [ -e "$BIN/$1" ] && [ -f "$BIN/.$1.ok" ]; }
mark() { touch "$BIN/.$1.ok"; }
timed() { local t0; t0=$(date +%s); "$@"; log "  $1 took $(( $(date +%s) - t0 ))s"; }

# containerd and the kubelet come from the shared Go module (go-shared.sh). The control plane builds
# first: its build compiles the libraries they share, so two builds never compile them side by side.
build_containerd() {
  have containerd && have ctr && have containerd-shim-runc-v2 && return
  shared_after_control_plane || die "the control plane build or the shared Go module failed (see above)"
  log "building containerd $CONTAINERD_VERSION (containerd, ctr, containerd-shim-runc-v2)"
  local m=github.com/containerd/containerd/v2/cmd
  shared_build "$BIN" "-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}" \
    "$m/containerd" "$m/ctr" "$m/containerd-shim-runc-v2" \
    || die "building containerd failed (see above)"
  mark containerd; mark ctr; mark containerd-shim-runc-v2
}

build_kubelet() {
  have kubelet && return
  shared_after_control_plane || die "the control plane build or the shared Go module failed (see above)"
  log "building kubelet $KUBERNETES_VERSION"
  shared_build "$BIN" "$KUBERNETES_LDFLAGS" k8s.io/kubernetes/cmd/kubelet || die "building the kubelet failed (see above)"
  mark kubelet
}

build_pause() {
  have pause.tar && return
  command -v gcc >/dev/null || die "gcc is required to build the pause binary"
  bash "$HERE/install-node-packages.sh"
  command -v podman >/dev/null || die "podman is required (bash hack/install-node-packages.sh)"
  log "building $PAUSE_IMAGE (FROM scratch, a static pause binary)"
  local ctx; ctx="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$ctx'" RETURN
  cat > "$ctx/pause.c" <<'C'
/* The sandbox's first process: holds the pod's namespaces, reaps zombies, exits on SIGINT/SIGTERM. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>
static void down(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, down);
  signal(SIGTERM, down);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
C
  gcc -Os -static -s -o "$ctx/pause" "$ctx/pause.c" || die "compiling pause failed"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' > "$ctx/Containerfile"
  "${PODMAN[@]}" build --pull=never --runtime runc --network host -q -t "$PAUSE_IMAGE" -f "$ctx/Containerfile" "$ctx" >&2 \
    || die "building the pause image failed"
  rm -f "$BIN/pause.tar"
  "${PODMAN[@]}" save --format docker-archive -o "$BIN/pause.tar" "$PAUSE_IMAGE" >&2 || die "saving the pause image failed"
  mark pause.tar
}

start=$(date +%s)
# Arguments name the pieces to build (containerd, pause, kubelet); none: all of them.
for piece in "${@:-containerd pause kubelet}"; do
  for p in $piece; do timed "build_$p"; done
done
log "node binaries ready in $BIN ($(( $(date +%s) - start ))s)"
echo "$BIN"
