# The official MLflow image lacks the PostgreSQL driver and the S3 client its server needs here.
# Keep MLFLOW_VERSION equal to the mlflow that mlreg is tested with (tests/integration/test_infra.py).
ARG MLFLOW_VERSION=3.17.2
FROM ghcr.io/mlflow/mlflow:v${MLFLOW_VERSION}
RUN pip install --no-cache-dir "psycopg2-binary==2.9.*" "boto3==1.*" \
    && useradd --uid 1000 --create-home --shell /usr/sbin/nologin mlflow
USER 1000
EXPOSE 5000
