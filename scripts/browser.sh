#!/usr/bin/env bash
# Install the browser tests/test_dashboard_browser.py drives: Debian's chromium (Playwright
# runs it as the system browser; nothing is downloaded by Playwright itself). Idempotent; needs
# root and apt. Without chromium that test skips and says why.
set -euo pipefail
if ! command -v chromium >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y chromium >&2
fi
