# Airflow 3.3 with Primus installed (the plugin via its entry point, the DAG factory in
# /opt/primus/dags). Not built here: the development machines have no Docker engine.
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update && apt-get install -y --no-install-recommends libkrb5-dev gcc && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --chown=airflow:root requirements/lock.txt /opt/primus/requirements/lock.txt
# torch: take the CPU build (configure pip's index for CPU wheels); a default torch is a CUDA build.
RUN pip install --no-cache-dir torch==2.13.0 \
 && pip install --no-cache-dir -r /opt/primus/requirements/lock.txt \
 && pip install --no-cache-dir --no-deps torchrec==1.8.0
COPY --chown=airflow:root . /opt/primus
RUN pip install --no-cache-dir --no-deps /opt/primus
