#!/usr/bin/env bash
# Installs the Debian packages the real-node tier needs (tests/integration/test_real_node.py,
# devkit/realnode.py): runc (the OCI runtime; Debian's crun refuses this machine's hybrid cgroup
# layout), the CNI plugins (bridge, host-local, loopback in /usr/lib/cni), nftables and iptables
# (the Service-IP stand-in and the kubelet's own chains), podman/buildah (build the unmodified
# Dockerfile) and mmdebstrap (the Python base image from Debian packages). Idempotent: installs only
# what is missing, so a warm machine does nothing. Needs root (CI and the tier run as root).
set -euo pipefail

PKGS=(runc containernetworking-plugins nftables iptables podman buildah mmdebstrap)
log() { printf '[hack/node-packages] %s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

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
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
log "installed in $(( $(date +%s) - start ))s"
