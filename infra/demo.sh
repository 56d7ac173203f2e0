#!/usr/bin/env bash
# The whole mlreg story on embedded defaults (called by `make demo`):
# stack up (Triton + MLflow UI) -> export and register everything -> promote the ensemble and its
# members -> the seed's request -> export a changed image_model -> promote it -> request again ->
# mlreg status and the MLflow UI URL.  State lives in .mlreg/demo (reset on every run), or in
# $MLREG_HOME when set (reset only if it is missing or an earlier demo's folder).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
MLREG=.venv/bin/mlreg
given_home="${MLREG_HOME:-}"
export MLREG_HOME="${MLREG_HOME:-$PWD/.mlreg/demo}" MLREG_NO_PROGRESS=1
unset MLFLOW_TRACKING_URI
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
say() { printf '\n== %s\n' "$*"; }

if [ -n "$given_home" ] && [ -e "$MLREG_HOME" ] && [ ! -e "$MLREG_HOME/.mlreg-demo" ]; then
  echo "error: MLREG_HOME=$MLREG_HOME exists and is not an earlier demo's folder" >&2
  echo "fix: point MLREG_HOME at a new folder, or unset it for .mlreg/demo" >&2
  exit 2
fi
"$MLREG" stack down >/dev/null 2>&1 || true
rm -rf "$MLREG_HOME"
mkdir -p "$MLREG_HOME" && touch "$MLREG_HOME/.mlreg-demo"
trap 'status=$?; if [ $status -ne 0 ]; then "$MLREG" stack down; fi' EXIT

say "starting the local stack on an empty repository: tritonserver (CPU, explicit model control) + the MLflow UI"
"$MLREG" stack up
url=$("$MLREG" stack status --json | json "d['grpc_url']")
ui=$("$MLREG" stack status --json | json "d.get('mlflow_url', '')")

say "exporting the template's models and registering every version in MLflow"
"$MLREG" export

say "promoting ensemble_multi_modal_model v1 (and the member versions it pins)"
"$MLREG" promote ensemble_multi_modal_model --version 1

say "the seed's request: table 1, 2 + the golden JPEG"
"$PY" model_repository_template/multi_modal_client.py --url "$url"

say "exporting a changed image_model (--seed 7) and promoting it"
v2=$("$MLREG" export image_model --seed 7 --json | json "d['versions'][0]['version']")
"$MLREG" promote image_model --version "$v2"

say "the same request, now answered through image_model v$v2"
"$PY" model_repository_template/multi_modal_client.py --url "$url"

say "mlreg status"
"$MLREG" status
say "promotion history of image_model"
"$MLREG" history image_model
printf '\nMLflow UI: %s  (the stack keeps running; stop it with: MLREG_HOME=%s %s stack down)\n' \
  "$ui" "$MLREG_HOME" "$MLREG"
