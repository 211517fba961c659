#!/usr/bin/env bash
# Install what tests/test_docker_image.py builds and runs the image with: Debian's podman, runc
# and debootstrap (no Docker daemon and no registry here; docker/base-image.sh makes the base
# from Debian packages). Idempotent; needs root and apt. Without them that test skips and says
# why.
set -euo pipefail
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if (( ${#missing[@]} )); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y "${missing[@]}" >&2
fi
