#!/usr/bin/env sh
# The one way fedweave is installed: CI (.ci/run) and the Dockerfile both run this script,
# so every CI run exercises the image's install steps.
#
#   TORCH_SPEC       torch requirement (default torch==2.13.0: the CPU wheel CI uses)
#   TORCH_INDEX      pip index for torch; empty = pip's configured index (CI). The image uses
#                    https://download.pytorch.org/whl/cpu (CPU) or .../whl/cu124 (CUDA).
#   FEDWEAVE_EXTRAS  extras, e.g. "[dev]" (CI: everything, simulation included) or
#                    "[postgres]" (image: a site's or coordinator's light install, no Ray);
#                    default none (pip install fedweave); "[simulation]" for fedweave simulate
#   EDITABLE         1: pip install -e (a development checkout, as CI does)
# Run from the repository root, inside the environment to install into.
set -eu
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TORCH_INDEX="${TORCH_INDEX:-}"
FEDWEAVE_EXTRAS="${FEDWEAVE_EXTRAS:-}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first and on its own: an unpinned torch from the default index pulls a multi-GB CUDA
# build, and fedweave's own requirement is a range that accepts whatever is installed here.
if [ -n "$TORCH_INDEX" ]; then
    pip install --index-url "$TORCH_INDEX" "$TORCH_SPEC"
else
    pip install "$TORCH_SPEC"
fi
if [ "${EDITABLE:-0}" = "1" ]; then
    pip install -e ".${FEDWEAVE_EXTRAS}"
else
    pip install ".${FEDWEAVE_EXTRAS}"
fi
fedweave version
