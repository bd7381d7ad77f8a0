# syntax=docker/dockerfile:1.7
# gpuhealth: one image for the operator (gpuhealth-operator) and the agent (gpuhealth-agent).
#
#   docker build -t ghcr.io/gpuhealth/gpuhealth:0.1.0 .
#
# The builder turns the project and every dependency into wheels; the final image installs only
# those wheels (no compilers, no build tools, no source tree) and runs as the unprivileged user
# 65532, which the Kubernetes manifests also require. NVML (libnvidia-ml.so.1) is not in the image:
# the NVIDIA container toolkit injects the host driver's copy into the agent's container.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (see .dockerignore).
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python -m pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpuhealth" \
      org.opencontainers.image.description="Kubernetes operator and node agent that keep broken GPUs from wasting a fleet" \
      org.opencontainers.image.source="https://github.com/gpuhealth/gpuhealth" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Install from the builder's wheels only (--no-index: nothing is fetched here); the wheels are
# bind-mounted for this step and do not stay in a layer. Byte-code is compiled now because the
# root filesystem is read-only at run time.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels gpuhealth \
    && python -m compileall -q "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && groupadd --system --gid 65532 gpuhealth \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin gpuhealth
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 8081 9401
# The manifests set the command: gpuhealth-operator ... or gpuhealth-agent.
CMD ["gpuhealth-operator"]
