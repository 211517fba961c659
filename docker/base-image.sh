#!/usr/bin/env sh
# Build the Dockerfile's base image from Debian packages, for hosts that cannot pull
# python:3.11.9-slim-bookworm (no registry reachable, only a Debian mirror and PyPI):
#
#   sh docker/base-image.sh [IMAGE]            # default localhost/fedweave-base:bookworm
#   podman build --build-arg PYTHON_IMAGE=localhost/fedweave-base:bookworm -t fedweave .
#
# The image holds Debian bookworm's python3 (3.11), venv, pip and CA certificates, plus the
# CA certificates this host added under /usr/local/share/ca-certificates (a TLS-inspecting
# proxy's, say), so pip inside the build trusts what pip on this host trusts. Debian marks its
# python "externally managed" (PEP 668); the marker is removed because the image, like the
# python: images, installs fedweave into the system python. Needs root, debootstrap and
# podman (Debian packages). Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -eu
IMAGE="${1:-localhost/fedweave-base:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOTFS="$(mktemp -d /tmp/fedweave-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT

debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates,passwd \
    bookworm "$ROOTFS" "$MIRROR" >&2
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
    chroot "$ROOTFS" update-ca-certificates >&2
fi
rm -f "$ROOTFS"/usr/lib/python3*/EXTERNALLY-MANAGED
tar -C "$ROOTFS" -c . | podman import \
    --change 'ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - "$IMAGE" >&2
echo "$IMAGE"
