# One image for every role: `docker run IMAGE coordinator ...`, `docker run IMAGE client ...`,
# `docker run IMAGE peer ...`, `docker run IMAGE certs init ...`.
#
#   docker build -t fedweave .                                   # CPU torch (default)
#   docker build -t fedweave:cuda \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 \
#       --build-arg TORCH_SPEC="torch>=2.2,<3" .                  # CUDA torch
#
# The install steps are docker/install.sh, the same script CI runs.
# Base pinned to an exact tag; pin its digest too where you build (docker buildx imagetools
# inspect python:3.11.9-slim-bookworm) and write it as python:3.11.9-slim-bookworm@sha256:...
# Where no registry is reachable: sh docker/base-image.sh (Debian packages), then
# --build-arg PYTHON_IMAGE=localhost/fedweave-base:bookworm (tests/test_docker_image.py).
ARG PYTHON_IMAGE=python:3.11.9-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX="https://download.pytorch.org/whl/cpu"
# Sites and coordinators: the light install (no Ray, flwr-datasets or pyarrow: `fedweave
# simulate` is not for the image). Add "[postgres,parquet]" for Parquet site files, or
# "[postgres,simulation]" for an image that simulates.
ARG FEDWEAVE_EXTRAS="[postgres]"

# Offline by default: no telemetry, no update checks, no runtime dependency installation.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    RAY_USAGE_STATS_ENABLED=0 \
    FLWR_HOME=/var/lib/fedweave/flwr

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin fedweave \
    && mkdir -p /var/lib/fedweave/pki /var/lib/fedweave/data /var/lib/fedweave/history \
                /var/lib/fedweave/flwr /var/lib/fedweave/work \
    && chown -R fedweave:fedweave /var/lib/fedweave

WORKDIR /opt/fedweave
COPY pyproject.toml README.md ./
COPY docker/install.sh docker/install.sh
COPY fedweave fedweave
COPY client client
COPY coordinator coordinator
COPY gossip gossip
COPY simulations simulations
RUN TORCH_SPEC="${TORCH_SPEC}" TORCH_INDEX="${TORCH_INDEX}" FEDWEAVE_EXTRAS="${FEDWEAVE_EXTRAS}" \
    sh docker/install.sh \
    && rm -rf /root/.cache

USER fedweave
WORKDIR /var/lib/fedweave/work
# The coordinator's default port (sites connect here).
EXPOSE 9092
ENTRYPOINT ["fedweave"]
CMD ["--help"]
