# Source this before `airflow standalone` / scheduler / api-server / dag-processor / triggerer.
# PRIMUS_ROOT: the checkout (or install) holding dags/ and config/jobs/.
export PRIMUS_ROOT="${PRIMUS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$PRIMUS_ROOT/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$PRIMUS_ROOT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-4}"
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=30
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=30
# The task supervisor waits up to this many seconds in one select() call; when a task's sockets
# close before its process can be reaped (about one task in five here) it notices the exit only then:
# 5 s (the default) per such task, 1 s with this (docs/airflow.md "Known limits").
export AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL="${AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL:-1}"
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT="${AIRFLOW__API__PORT:-8080}"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:${AIRFLOW__API__PORT}/execution/"
# Job specs (one DAG each) and where their data and state live.
export PRIMUS_JOBS_DIR="${PRIMUS_JOBS_DIR:-$PRIMUS_ROOT/config/jobs}"
export PRIMUS_DATA="${PRIMUS_DATA:-$PRIMUS_ROOT/.primus/data}"
export PRIMUS_HOME="${PRIMUS_HOME:-$PRIMUS_ROOT/.primus}"
# The DAG's knobs are spec fields (spec.airflow: poll_interval, source_timeout, max_active_runs;
# docs/spec.md); every variable Primus reads is in docs/settings.md.
# For `primus backfill --api`:
export PRIMUS_AIRFLOW_API="${PRIMUS_AIRFLOW_API:-http://127.0.0.1:${AIRFLOW__API__PORT}}"
