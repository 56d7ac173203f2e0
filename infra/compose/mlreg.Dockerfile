# mlreg's core CLI (no TensorFlow, no local stack): what the store-init step and CI jobs run.
# Build from the repository root: docker build -f infra/compose/mlreg.Dockerfile -t ghcr.io/acme/mlreg:0.1.0 .
# (.github/workflows/release.yml builds and pushes it for each version tag, with provenance and an SBOM)
FROM python:3.11.11-slim-bookworm
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mlreg ./mlreg
COPY registry ./registry
COPY pipelines ./pipelines
RUN pip install --no-cache-dir . \
    && useradd --uid 1000 --create-home --shell /usr/sbin/nologin mlreg
USER 1000
WORKDIR /home/mlreg
ENTRYPOINT []
CMD ["mlreg", "--help"]
