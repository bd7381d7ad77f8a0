#!/usr/bin/env bash
# Installs the Debian packages the real-node tier needs (tests/integration/test_real_node.py,
# devkit/realnode.py): runc (the OCI runtime; Debian's crun refuses this machine's hybrid cgroup
# layout), the CNI plugins (bridge, host-local, loopback in /usr/lib/cni), nftables (the stand-in
# for kube-proxy's Service IP), podman (builds the unmodified Dockerfile; its build is buildah's
# code) and mmdebstrap (the Python base image from Debian packages). iptables comes in as a
# dependency; nothing here uses it (devkit/realnode.py keeps it off the kubelet's PATH, so the
# kubelet writes no chains on the host). Idempotent: installs only
# what is missing, so a warm machine does nothing. Needs root (CI and the tier run as root).
set -euo pipefail

PKGS=(runc containernetworking-plugins nftables podman mmdebstrap)
log() { printf '[hack/node-packages] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# One install at a time (the image and node builds may both ask); the second waits, then finds them.
CACHE="${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}"
mkdir -p "$CACHE"
exec 9>"$CACHE/.node-packages.lock"
flock 9

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
[ "$(id -u)" -eq 0 ] || { log "ERROR: root is needed to install: ${missing[*]}"; exit 1; }
start=$(date +%s)
log "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >&2
log "installed in $(( $(date +%s) - start ))s"
