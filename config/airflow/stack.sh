# The live stack's Airflow (`make up`, devstack/stack.py): sourced after env.sh by the stack, which
# sets AIRFLOW_HOME, AIRFLOW__API__PORT, the metadata database URL and the PRIMUS_* paths first.
# Tuned for a 2-core machine: few task processes at once, quick scheduling and deferral checks.
export AIRFLOW__CORE__PARALLELISM="${PRIMUS_STACK_PARALLELISM:-3}"
export AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG="${PRIMUS_STACK_PARALLELISM:-3}"
export AIRFLOW__API__BASE_URL="http://127.0.0.1:${AIRFLOW__API__PORT}"
export AIRFLOW__API__WORKERS=1
export AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES=1
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=10
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=60
export AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC=2
export AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT=1200
export AIRFLOW__TRIGGERER__CAPACITY=100
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=True
# The simple auth manager: user admin (role admin); its password is kept in
# $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated (the stack writes a fixed one).
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin"
# Windows are polled, not pushed: a short poll keeps the demo's idle time low (the demo spec's
# spec.airflow.poll_interval expands this variable).
export PRIMUS_POLL_INTERVAL="${PRIMUS_POLL_INTERVAL:-2s}"
