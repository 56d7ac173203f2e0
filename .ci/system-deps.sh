#!/usr/bin/env bash
# Debian packages the test suite needs (real servers and tools, no mocks), installed only when missing.
# Add a package here, with the test that needs it in the comment, never by hand on a machine.
set -euo pipefail
packages=(
  gcc            # tests/component/test_local_triton.py builds a real ELF whose library is missing
  kubectl        # tests/integration/test_infra.py renders infra/k8s overlays (kubectl kustomize)
  postgresql     # tests/integration/test_postgres.py runs MLflow on a real PostgreSQL server
  chromium       # tests/integration/test_browser.py opens the MLflow UI headless (--dump-dom, --screenshot)
)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
