# Airflow 3.3 with Primus installed: the plugin through its entry point, the DAG factory in
# /opt/primus/dags with one generated DAG file per spec of /opt/primus/config/jobs (made here, at
# build time: Airflow's parsing never writes them), and the trainer's stack (torch CPU build,
# TorchRec) because the local backend starts trainers and stream executors from the task
# process. Used by docker-compose.yaml and, as images.airflow, by config/helm/values.yaml.
# NOT BUILT on the development machines (no Docker engine).
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update && apt-get install -y --no-install-recommends libkrb5-dev gcc && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/primus && chown airflow:root /var/lib/primus
USER airflow
COPY --chown=airflow:root requirements/lock.txt /opt/primus/requirements/lock.txt
# torch: the CPU wheel (PyPI's default torch is a CUDA build); torchrec without its deps (they
# would drag the CUDA fbgemm-gpu); the rest is the lock the tests run with.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install --no-cache-dir -r /opt/primus/requirements/lock.txt \
 && pip install --no-cache-dir --no-deps torchrec==1.8.0
# Only what the image runs (the build context also holds .venv and .primus, which stay out).
COPY --chown=airflow:root pyproject.toml README.md /opt/primus/
COPY --chown=airflow:root primus_lib /opt/primus/primus_lib
COPY --chown=airflow:root plugins /opt/primus/plugins
COPY --chown=airflow:root dags /opt/primus/dags
COPY --chown=airflow:root config /opt/primus/config
RUN pip install --no-cache-dir --no-deps /opt/primus \
 && rm -rf /opt/primus/dags/primus_jobs \
 && PRIMUS_JOBS_DIR=/opt/primus/config/jobs PRIMUS_DATA=/var/lib/primus/data PRIMUS_HOME=/var/lib/primus/home \
    python /opt/primus/dags/primus_dags.py
ENV PRIMUS_ROOT=/opt/primus PRIMUS_JOBS_DIR=/opt/primus/config/jobs AIRFLOW__CORE__DAGS_FOLDER=/opt/primus/dags
