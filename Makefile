# gpuhealth: everything a developer or CI runs. See README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BUILD := build
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help venv crds control-plane tools kueue chart-tools real-node coldstart lint typecheck unit integration test demo bench fleetprobe chaos soak cluster-up cluster-down clean

help:
	@echo "make demo          run the end-to-end demo on a local control plane (sets everything up)"
	@echo "make demo KUEUE=1  the same, its training job under Kueue with gpuhealth's AdmissionCheck"
	@echo "make demo REAL_NODE=1  the same, its device-plugin and XID 79 stories on a real kubelet node with NVIDIA's device plugin, through the installed chart (root)"
	@echo "make test          lint, type-check, unit and integration tests (what CI runs)"
	@echo "make bench         performance report on 1,000 fake GPU nodes"
	@echo "make fleetprobe    the operator alone at 100,000 nodes, in process (docs/scaling.md)"
	@echo "make chaos         fault-injection suite"
	@echo "make coldstart     time a cold make test (scratch clone, empty caches) into results/build/"
	@echo "make soak          random faults, kills and node churn for SOAK_MINUTES (30); resource slopes"
	@echo "make crds          regenerate crds/*.yaml from operator/gpuhealth/api/ (hack/gen_crds.py)"
	@echo "make cluster-up    start a local control plane with fake GPU nodes (make cluster-down stops it)"
	@echo "make cluster-down  stop it, and undo what a real node (tests/integration/test_real_node.py) left"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $@

venv: $(STAMP)

crds: $(STAMP)
	$(PY) -m hack.gen_crds

# Builds (first time) or finds (cached) the control-plane binaries; fails loudly.
control-plane:
	@bash hack/build-control-plane.sh >/dev/null

# Builds (first time) or finds (cached) helm and promtool for the chart and alert tests, and Kueue's
# manager, CRDs and webhooks for tests/integration/test_kueue.py; fails loudly.
tools: kueue chart-tools

chart-tools:
	@bash hack/build-tools.sh >/dev/null

# Builds (first time) or finds (cached) Kueue's manager, CRDs and webhooks; fails loudly.
kueue:
	@bash hack/build-kueue.sh >/dev/null

# Builds (first time) or finds (cached) what the real-node tier (tests/integration/test_real_node.py,
# test_device_plugin.py) runs: the Debian packages (runc, CNI plugins, nftables, podman, mmdebstrap),
# containerd, the kubelet, the pause image, gpuhealth's image from the Dockerfile on a Python base made
# from Debian packages, and NVIDIA's device plugin and GPU Feature Discovery with their image on that
# base. Needs root, as the tier does; fails loudly.
# The Go builds (containerd, kubelet, then the device plugin and GFD) use the CPUs while the image
# build mostly waits on the network (apt, mmdebstrap, pip): the two run side by side, and a failure of
# either stops make. The kubelet's build runs hack/build-control-plane.sh first (it shares that
# build's Go cache). NVIDIA's image needs the Python base, so it comes last.
real-node:
	@{ bash hack/build-node.sh containerd kubelet >/dev/null && bash hack/build-nvidia-plugins.sh binaries >/dev/null; } & node=$$!; \
	bash hack/build-image.sh >/dev/null; image=$$?; \
	wait $$node; node_rc=$$?; test $$image -eq 0 -a $$node_rc -eq 0
	@bash hack/build-node.sh pause >/dev/null
	@bash hack/build-nvidia-plugins.sh image >/dev/null

lint: $(STAMP)
	$(VENV)/bin/ruff check operator devkit tests hack
	$(VENV)/bin/ruff format --check operator devkit tests hack

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	@mkdir -p $(BUILD)
	$(PY) -m pytest tests/unit -q --junitxml=$(BUILD)/junit-unit.xml

# What the tests need, built side by side on a fresh machine: the Go builds share the CPUs while the
# network-bound steps (module downloads, apt, the image's base and pip) wait, and each build script
# holds a lock of its own, so two never build the same thing. -O prints each target's log when it ends.
SIDE_BY_SIDE := $(MAKE) --no-print-directory -j4 -O

integration: $(STAMP)
	@$(SIDE_BY_SIDE) control-plane tools real-node
	@mkdir -p $(BUILD)
	$(PY) -m pytest tests/integration -q --junitxml=$(BUILD)/junit-integration.xml

# Tests run on TEST_WORKERS processes (pytest-xdist; tests/conftest.py keeps each module on one worker,
# each worker with its own control plane): most of an integration test's time is waiting on the
# operator and the control plane, so two overlap well even on two cores.
# Only the control plane is built before the tests start. What a few modules alone need (Kueue, helm
# and promtool, the real node and the image) builds behind the first tests, on the CPU time that
# waiting tests leave idle (a cold run's tests kept the two CPUs 54% busy: results/build/): those
# modules run last, and each waits for its build before its first test (tests/conftest.py, BEHIND).
# The builds behind run at the lowest CPU priority (nice 19): they take the CPU the tests leave idle
# and never slow a running test, whose operator and control plane answer on the tests' clock (a cold
# run at equal priority spent 34 minutes on tests that take 25 on a warm machine).
# A failed build behind the tests fails make test, as a failed build before them would; its log
# follows the tests' summary.
TEST_WORKERS ?= 2
BEHIND_LOG := $(BUILD)/builds-behind-tests.log
test: $(STAMP)
	@$(SIDE_BY_SIDE) control-plane lint typecheck
	@mkdir -p $(BUILD)
	nice -n 19 $(SIDE_BY_SIDE) tools real-node >$(BEHIND_LOG) 2>&1 & behind=$$!; \
	$(PY) -m pytest tests -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadscope --durations=20 --junitxml=$(BUILD)/junit.xml; \
	tests=$$?; wait $$behind; builds=$$?; cat $(BEHIND_LOG); \
	if [ $$builds -ne 0 ]; then echo "make test: a build behind the tests failed (its log is above)" >&2; fi; \
	test $$tests -eq 0 -a $$builds -eq 0

# KUEUE=1: the training job runs under Kueue (hack/demo/kueue.py); only then is Kueue built or needed.
# REAL_NODE=1: the device-plugin story (hack/demo/deviceplugin.py, beside NVIDIA's device plugin) and
# the XID 79 story run on a real kubelet node through the installed chart (hack/demo/realnode.py); only
# then are the node, the image and NVIDIA's plugins built or needed (root, as the tier).
DEMO_KUEUE := $(filter 1 yes true,$(KUEUE))
DEMO_REAL_NODE := $(filter 1 yes true,$(REAL_NODE))
demo: $(STAMP) control-plane $(if $(DEMO_KUEUE),kueue) $(if $(DEMO_REAL_NODE),real-node)
	$(PY) -m hack.demo $(if $(DEMO_KUEUE),--kueue) $(if $(DEMO_REAL_NODE),--real-node) $(DEMO_ARGS)

bench: $(STAMP) control-plane
	$(PY) -m hack.bench $(BENCH_ARGS)

# The operator alone at fleet scale, in process (no control plane; docs/scaling.md). On request only.
FLEETPROBE_ARGS ?= --sizes 2000,5000,10000
fleetprobe: $(STAMP)
	$(PY) -m hack.fleetprobe $(FLEETPROBE_ARGS)

chaos: $(STAMP) control-plane
	$(PY) -m hack.chaos $(CHAOS_ARGS)

# A cold `make test` in a scratch clone with empty caches, timed and filed (results/build/); on request.
coldstart: $(STAMP)
	$(PY) -m hack.coldstart $(COLDSTART_ARGS)

SOAK_MINUTES ?= 30
soak: $(STAMP) control-plane
	$(PY) -m hack.chaos --soak $(SOAK_MINUTES) $(CHAOS_ARGS)

cluster-up: $(STAMP) control-plane
	$(PY) -m hack.cluster up $(CLUSTER_ARGS)

cluster-down: $(STAMP)
	$(PY) -m hack.cluster down

clean:
	rm -rf $(BUILD)
