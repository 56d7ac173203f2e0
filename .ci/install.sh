#!/usr/bin/env bash
# Installs mlreg[all,dev] (editable) into the virtualenv $1: with uv where it can (~55 s on a fresh
# venv and an empty uv cache here, 16 s with the cache filled), else with pip (~90 s; ~140 s when it
# byte-compiles every dependency, which neither does: `make install` then writes the bytecode of what
# mlreg's processes import, .ci/bytecode.py).
# uv reads none of pip's configuration: the indexes, find-links, constraints and certificate pip is
# configured with (pip.conf, PIP_* variables) are handed to uv, so both install the same versions.
# MLREG_INSTALL_WITH=pip skips uv.
set -euo pipefail
venv=$1
py=$venv/bin/python

pip_install() {
    set -o pipefail
    "$py" -m pip install --quiet --no-compile --disable-pip-version-check -e '.[all,dev]' 2>&1 \
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
    -e '.[all,dev]'; then
    echo "uv could not install mlreg's dependencies (above): pip installs them instead" >&2
    pip_install
fi
