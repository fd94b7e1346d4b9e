#!/usr/bin/env bash
# Create .venv with everything specdec needs (CPU torch from the pinned local wheel).
#   ./setup.sh          runtime
#   ./setup.sh --test   runtime + test tools
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra}"
echo "specdec installed in .venv ($(.venv/bin/specdec --help >/dev/null && echo ok))"
