#!/usr/bin/env bash
# Installs mlreg[all,dev] (editable) into the virtualenv $1: with uv where it can (~55 s on a fresh
# venv and an empty uv cache here, 16 s with the cache filled), else with pip (~90 s); neither
# byte-compiles the dependencies unless Python cannot cache what it imports (below).
# uv reads none of pip's configuration: the indexes, find-links, constraints and certificate pip is
# configured with (pip.conf, PIP_* variables) are handed to uv, so both install the same versions.
# MLREG_INSTALL_WITH=pip skips uv.
#
# Where PYTHONDONTWRITEBYTECODE is set (this CI's environment sets it), Python never writes the
# bytecode of what it imports: every process of the suite compiles each module it imports again
# (importing MLflow and TensorFlow takes ~15 s instead of ~8).  There the install byte-compiles the
# virtualenv and mlreg's own packages once (~40 s on 2 cores); elsewhere Python caches what it
# imports on first use and nothing is compiled up front.
set -euo pipefail
venv=$1
py=$venv/bin/python
compile=--no-compile
uv_compile=()
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
    compile=--compile
    uv_compile=(--compile-bytecode)
    trap '"$py" -m compileall -q -j 0 mlreg registry pipelines tests >/dev/null' EXIT
fi

pip_install() {
    set -o pipefail
    "$py" -m pip install --quiet "$compile" --disable-pip-version-check -e '.[all,dev]' 2>&1 \
        | { grep -v '^WARNING: Location' || true; }
}

if [ "${MLREG_INSTALL_WITH:-uv}" != uv ] \
    || ! "$py" -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1; then
    pip_install
    exit
fi

# pip's settings as uv options, one per line (pip config list: "scope.key='value'")
mapfile -t args < <("$py" - <<'EOF'
import subprocess, sys

out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
settings = {}
for line in out.splitlines():
    key, _, value = line.partition("=")
    settings[key.split(".", 1)[-1]] = value.strip().strip("'\"")
options = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint"}
if "index-url" in settings:
    print("--index-url"); print(settings["index-url"])
for key, option in options.items():
    for value in settings.get(key, "").split():
        print(option); print(value)
for host in settings.get("trusted-host", "").split():
    print("--allow-insecure-host"); print(host)
EOF
)
cert=$("$py" -m pip config get global.cert 2>/dev/null || echo "${PIP_CERT:-}")
if [ -n "$cert" ]; then export SSL_CERT_FILE=$cert; fi
# pip takes the best version any index offers: so does uv with unsafe-best-match
if ! "$venv/bin/uv" pip install --quiet --python "$py" --index-strategy unsafe-best-match "${args[@]}" \
    "${uv_compile[@]}" -e '.[all,dev]'; then
    echo "uv could not install mlreg's dependencies (above): pip installs them instead" >&2
    pip_install
fi
