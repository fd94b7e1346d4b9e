#!/usr/bin/env bash
# Create .venv with everything specdec needs (CPU torch from the pinned local wheel).
#   ./setup.sh          runtime
#   ./setup.sh --test   runtime + test tools, and (where npm is available) the VS Code extension's build and the
#                       real-editor test's tools: code-server, node 24, Debian chromium (in the tests' own cache,
#                       ~/.cache/specdec-tests/vscode-e2e: vscode-client/e2e/install-tools.sh; never ~/.cache/specdec)
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra}"
echo "specdec installed in .venv ($(.venv/bin/specdec --help >/dev/null && echo ok))"

if [ "${1:-}" = "--test" ]; then
  if command -v npm >/dev/null && (cd vscode-client && npm ci --silent && npm run --silent build) \
      && vscode-client/e2e/install-tools.sh; then
    echo "VS Code extension built; real-editor test tools ready"
  elif [ "${CI:-}" = "true" ]; then
    echo "setup: the VS Code extension or its real-editor test tools failed to install" >&2
    exit 1
  else
    echo "setup: WARNING: no npm or the VS Code tools failed to install; tests/editors/test_vscode.py will be skipped" >&2
  fi
fi
