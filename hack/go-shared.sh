# Sourced by build-control-plane.sh, build-node.sh and build-tools.sh (after versions.env): the one Go
# module that every Kubernetes-side tool of hack/ is built from.
#
# Why one module: Go reuses a compiled package only when its source, its flags and every package below
# it are the same. Built each from its own module, etcd, kwok, helm and containerd each chose their own
# versions of client-go, apimachinery, grpc, protobuf and otel, and a fresh machine compiled those
# libraries once per tool (client-go with its API types alone is about 4 minutes of one core here).
# In one module, Go's minimal version selection picks one version of each library for all of them, so
# the control plane's build compiles them and every later build reuses it.
#
# What it costs: each tool runs with the newest version of a library that any of them requires (all
# within the Kubernetes v1.37 line; the tests of each tool's user are what say it still works), and
# etcd is the version Kubernetes itself requires (ETCD_VERSION must equal it). shared_module checks
# that the selection kept each command's module at the version SHARED_GETS asks, and stops with the version it chose otherwise.
# Prometheus (newest libraries of all), Kueue (its own pinned go.sum), and NVIDIA's plugins (cgo) keep
# their own modules.

SHARED_KEY="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_containerd-${CONTAINERD_VERSION}"
SHARED_MOD="$WORK/shared-$SHARED_KEY"
# Every command built from the module, each at its module's pinned version, resolved together once.
SHARED_GETS=(
  "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" "k8s.io/kubernetes/cmd/kube-controller-manager@$KUBERNETES_VERSION"
  "k8s.io/kubernetes/cmd/kube-scheduler@$KUBERNETES_VERSION" "k8s.io/kubernetes/cmd/kubelet@$KUBERNETES_VERSION"
  "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION"
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
)

# Writes and resolves the module once (a lock of its own: three scripts may ask at the same time);
# later calls find it resolved. go.mod: k8s.io/kubernetes with each staging module it requires at
# v0.0.0 (read from its go.mod) replaced by the published k8s.io/<module> v0.<minor>, then one `go get`
# of every command (SHARED_GETS).
shared_module() {
  mkdir -p "$SHARED_MOD"
  exec 8>"$SHARED_MOD/.lock"
  flock 8
  if [ ! -f "$SHARED_MOD/.resolved" ]; then
    local gomod minor staging_ver required
    gomod="$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
    [ -f "$gomod" ] || { echo "could not download k8s.io/kubernetes@${KUBERNETES_VERSION}" >&2; return 1; }
    minor="${KUBERNETES_VERSION#v1.}"
    staging_ver="v0.${minor}"
    required="$(awk '$2=="v0.0.0"{print $1}' "$gomod" | sort -u)"
    {
      echo "module gpuhealth.dev/hack/shared"
      echo
      echo "go $(sed -n 's/^go //p' "$gomod")"
      grep '^godebug' "$gomod" || true
      echo
      echo "replace ("
      sed -n '/^replace (/,/^)/p' "$gomod" | awk '/=> \.\/staging/{print $1}' | sort -u \
        | comm -12 - <(echo "$required") \
        | while read -r m; do echo "	$m => $m ${staging_ver}"; done
      echo ")"
    } > "$SHARED_MOD/go.mod"
    rm -f "$SHARED_MOD/go.sum"
    (cd "$SHARED_MOD" && GOFLAGS=-mod=mod go get "${SHARED_GETS[@]}" >&2) || return 1
    # Each command's module must still be at the version it was asked for.
    local get pkg got
    for get in "${SHARED_GETS[@]}"; do
      pkg="${get%@*}"
      got="$(cd "$SHARED_MOD" && go list -f '{{.Module.Path}} {{.Module.Version}}' "$pkg")" || return 1
      if [ "${got#* }" != "${get##*@}" ]; then
        echo "the shared module selected ${got% *} ${got#* }, not ${get##*@} as hack/versions.env pins: pin ${got#* } there" >&2
        return 1
      fi
    done
    touch "$SHARED_MOD/.resolved"
  fi
  flock -u 8
}

# For the tools built after the control plane (the kubelet, containerd, helm): its build first, so the
# libraries they share are compiled once, by it; then the module, which that build resolved.
shared_after_control_plane() {
  bash "$HERE/build-control-plane.sh" >/dev/null || { echo "the control plane build failed" >&2; return 1; }
  shared_module
}

# shared_build OUT LDFLAGS PACKAGE... : one `go build` of those commands into the directory OUT.
shared_build() {
  local out="$1" ldflags="$2"
  shift 2
  (cd "$SHARED_MOD" && GOFLAGS=-mod=readonly go build -trimpath -gcflags "$GO_GCFLAGS" -ldflags "$ldflags" -o "$out/" "$@")
}
