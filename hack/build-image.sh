#!/usr/bin/env bash
# Builds gpuhealth's container image from the unmodified Dockerfile with podman, without any
# registry, and caches it outside the repo keyed by its inputs (the build context the Dockerfile
# sees and the base recipe). Users keep running `docker build .` (docs/install.md).
#
# The Dockerfile's PYTHON_IMAGE (python:3.11-slim) is stood in for by an image made here from
# Debian packages: `mmdebstrap --variant=minbase` of the same Python minor, with a venv at
# /usr/local so python, pip and site-packages sit where the official image has them. pip inside
# the build reaches the package index as this machine's pip does: the host's CA bundle is
# bind-mounted into the RUN steps (nothing of it lands in a layer).
#
# Podman keeps its storage under the cache too (never the host's /var/lib/containers).
# Prints the image's directory on stdout's last line: image.tar (docker-archive for
# `ctr images import`), ref (the image's name) and id (its config digest). With the argument `base`
# it builds (or finds) only the base and prints its name.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
IMAGES="$CACHE/images"
# By its physical path: podman records its storage path and refuses the same storage reached
# another way (a symlinked cache, or GPUHEALTH_CACHE naming it through a link).
STORE="$(mkdir -p "$CACHE/podman" && cd "$CACHE/podman" && pwd -P)"
PODMAN=(podman --root "$STORE/storage" --runroot "$STORE/run")
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
BASE_REF=docker.io/library/python:3.11-slim

log() { printf '[hack/build-image] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[hack/build-image] ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$IMAGES"
exec 9>"$IMAGES/.lock"
flock 9
bash "$HERE/install-node-packages.sh"

# The base's key: the suite, the Python and this recipe (the lines between the markers).
base_recipe="$(sed -n '/^# base:begin/,/^# base:end/p' "${BASH_SOURCE[0]}")"
base_key="$(printf '%s\n%s\n%s\n' "$BASE_SUITE" "$BASE_PYTHON" "$base_recipe" | sha256sum | cut -c1-16)"

# base:begin
build_base() {
  if [ "$("${PODMAN[@]}" image inspect --format '{{index .Labels "dev.gpuhealth.base-key"}}' "$BASE_REF" 2>/dev/null)" = "$base_key" ]; then
    return
  fi
  log "building the stand-in for $BASE_REF: mmdebstrap $BASE_SUITE + $BASE_PYTHON, a venv at /usr/local"
  local t0; t0=$(date +%s)
  mmdebstrap --quiet --variant=minbase --include="$BASE_PYTHON,$BASE_PYTHON-venv,passwd" \
    --customize-hook="chroot \"\$1\" $BASE_PYTHON -m venv /usr/local" \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    "$BASE_SUITE" - \
    | "${PODMAN[@]}" import \
        --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change "LABEL dev.gpuhealth.base-key=$base_key" \
        --change 'CMD ["python3"]' - "$BASE_REF" >&2 \
    || die "building the base image failed"
  log "  base image took $(( $(date +%s) - t0 ))s"
}
# base:end

# `build-image.sh base`: the base alone (hack/build-nvidia-plugins.sh builds NVIDIA's image on it).
if [ "${1:-}" = base ]; then
  build_base
  echo "$BASE_REF"
  exit 0
fi

# The image's key: the base and every file of the build context the Dockerfile can see
# (.dockerignore keeps pyproject.toml, README.md and operator/ only).
context_key() {
  (
    cd "$REPO"
    echo "$base_key"
    sha256sum Dockerfile .dockerignore pyproject.toml README.md
    find operator -type f ! -path '*/__pycache__/*' ! -name '*.py[cod]' ! -path '*.egg-info*' -print0 \
      | sort -z | xargs -0 sha256sum
  ) | sha256sum | cut -c1-16
}

build_base
key="$(context_key)"
out="$IMAGES/gpuhealth-$key"
ref="localhost/gpuhealth:dev-$key"
if [ -f "$out/.ok" ]; then
  echo "$out"
  exit 0
fi
log "building $ref from the unmodified Dockerfile"
t0=$(date +%s)
rm -rf "$out"; mkdir -p "$out"
"${PODMAN[@]}" build --pull=never --runtime runc --network host \
  --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
  --volume "$CA_BUNDLE:$CA_BUNDLE:ro" \
  --layers=false -t "$ref" -f "$REPO/Dockerfile" "$REPO" >&2 \
  || die "podman build failed (see above)"
"${PODMAN[@]}" save --format docker-archive -o "$out/image.tar" "$ref" >&2 || die "saving the image failed"
echo "$ref" > "$out/ref"
"${PODMAN[@]}" image inspect --format '{{.Id}}' "$ref" > "$out/id"
"${PODMAN[@]}" rmi -f "$ref" >/dev/null 2>&1 || true
"${PODMAN[@]}" image prune -f >/dev/null 2>&1 || true
touch "$out/.ok"
log "image $ref built in $(( $(date +%s) - t0 ))s ($(du -m "$out/image.tar" | cut -f1) MB)"
# Keep the three newest builds (worktrees of one machine share the cache), drop older ones.
ls -1dt "$IMAGES"/gpuhealth-* | tail -n +4 | xargs -r rm -rf
echo "$out"
