#!/usr/bin/env bash
# Builds NVIDIA's device plugin and GPU Feature Discovery for the real node
# (tests/integration/test_device_plugin.py, devkit/nvidia_plugins.py), from their Go module and Debian
# packages only, cached outside the repo keyed by version like build-node.sh:
#   - nvidia-device-plugin and gpu-feature-discovery, both commands of github.com/NVIDIA/k8s-device-plugin
#     in one `go build` (they share most packages, so one compile serves both). go-nvml dlopens
#     libnvidia-ml.so.1, so they link with cgo against glibc, with NVIDIA's own link flags.
#   - their image, as NVIDIA ships them (both commands in one image, tagged as NVIDIA's), on the Debian
#     base hack/build-image.sh makes (glibc is what they need of it), saved as an archive for
#     `ctr images import`.
# The module's zip holds only vendor/modules.txt, not the vendored code, so the build resolves modules
# through the proxy. It pins sigs.k8s.io/node-feature-discovery v0.15.7, which the proxy does not serve
# (403); the copy here requires NFD_VERSION instead and moves the two imports (GFD's NodeFeature client,
# unused unless --use-node-feature-api) to where that release keeps them (api/generated, api/nfd).
# Nothing else of NVIDIA's source changes.
# Arguments name the pieces to build (binaries, image); none builds both.
# Prints the bin directory on stdout's last line. A warm cache rebuilds nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
BIN="$CACHE/bin/nvidia-plugins_${NVIDIA_DEVICE_PLUGIN_VERSION}_nfd-${NFD_VERSION}"
WORK="$CACHE/work"
STORE="$(mkdir -p "$CACHE/podman" && cd "$CACHE/podman" && pwd -P)"
PODMAN=(podman --root "$STORE/storage" --runroot "$STORE/run")
MODULE=github.com/NVIDIA/k8s-device-plugin
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=1 GOFLAGS=-mod=mod
export GOGC="${GOGC:-$GO_BUILD_GOGC}"

log() { printf '[hack/build-nvidia-plugins] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[hack/build-nvidia-plugins] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "the 'go' command is required to build NVIDIA's device plugin"
command -v gcc >/dev/null || die "gcc is required: the device plugin links with cgo"
mkdir -p "$BIN" "$WORK"
exec 9>"$BIN/.lock"
flock 9

have() { [ -e "$BIN/$1" ] && [ -f "$BIN/.$1.ok" ]; }
mark() { touch "$BIN/.$1.ok"; }
timed() { local t0; t0=$(date +%s); "$@"; log "  $1 took $(( $(date +%s) - t0 ))s"; }

build_binaries() {
  have nvidia-device-plugin && have gpu-feature-discovery && return
  log "building nvidia-device-plugin and gpu-feature-discovery $NVIDIA_DEVICE_PLUGIN_VERSION"
  local dir src="$WORK/k8s-device-plugin-$NVIDIA_DEVICE_PLUGIN_VERSION"
  dir="$(go mod download -json "$MODULE@$NVIDIA_DEVICE_PLUGIN_VERSION" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')"
  [ -d "$dir/cmd" ] || die "could not download $MODULE@$NVIDIA_DEVICE_PLUGIN_VERSION"
  rm -rf "$src"
  cp -r "$dir" "$src" && chmod -R u+w "$src" && rm -rf "$src/vendor"
  grep -rl --include='*.go' 'sigs.k8s.io/node-feature-discovery/pkg/' "$src/internal" "$src/cmd" \
    | xargs -r sed -i -e 's#sigs.k8s.io/node-feature-discovery/pkg/generated/#sigs.k8s.io/node-feature-discovery/api/generated/#' \
                      -e 's#sigs.k8s.io/node-feature-discovery/pkg/apis/nfd/v1alpha1#sigs.k8s.io/node-feature-discovery/api/nfd/v1alpha1#'
  (cd "$src" \
     && go mod edit -require="sigs.k8s.io/node-feature-discovery@$NFD_VERSION" \
                    -require="sigs.k8s.io/node-feature-discovery/api/nfd@$NFD_VERSION" \
     && go mod tidy >&2 \
     && go build -trimpath -gcflags "$GO_GCFLAGS" \
          -ldflags "-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files' -X $MODULE/internal/info.version=$NVIDIA_DEVICE_PLUGIN_VERSION" \
          -o "$BIN/" ./cmd/nvidia-device-plugin ./cmd/gpu-feature-discovery) \
    || die "building the device plugin and GFD failed (see above)"
  mark nvidia-device-plugin; mark gpu-feature-discovery
}

build_image() {
  have image.tar && return
  build_binaries
  local base
  base="$(bash "$HERE/build-image.sh" base | tail -n1)" || die "building the Debian base failed"
  log "building $NVIDIA_DEVICE_PLUGIN_IMAGE (both commands on $base)"
  local ctx; ctx="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$ctx'" RETURN
  cp "$BIN/nvidia-device-plugin" "$BIN/gpu-feature-discovery" "$ctx/"
  printf 'FROM %s\nCOPY nvidia-device-plugin gpu-feature-discovery /usr/bin/\nCMD ["nvidia-device-plugin"]\n' "$base" \
    > "$ctx/Containerfile"
  "${PODMAN[@]}" build --pull=never --runtime runc --network host -q -t "$NVIDIA_DEVICE_PLUGIN_IMAGE" \
    -f "$ctx/Containerfile" "$ctx" >&2 || die "building the image failed"
  rm -f "$BIN/image.tar"
  "${PODMAN[@]}" save --format docker-archive -o "$BIN/image.tar" "$NVIDIA_DEVICE_PLUGIN_IMAGE" >&2 \
    || die "saving the image failed"
  "${PODMAN[@]}" rmi -f "$NVIDIA_DEVICE_PLUGIN_IMAGE" >/dev/null 2>&1 || true
  echo "$NVIDIA_DEVICE_PLUGIN_IMAGE" > "$BIN/image.ref"
  mark image.tar
}

start=$(date +%s)
for piece in "${@:-binaries image}"; do
  for p in $piece; do timed "build_$p"; done
done
log "device plugin and GFD ready in $BIN ($(( $(date +%s) - start ))s)"
echo "$BIN"
