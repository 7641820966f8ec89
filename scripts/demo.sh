#!/usr/bin/env bash
# `make demo`: the ctr-demo job end to end on the embedded default, through Airflow.
#   1. Apache Kafka 4.4.0 (KRaft, `python -m devstack.kafka run`) on 127.0.0.1:19092, the address
#      the spec names (controller 127.0.0.1:19093); the jars come from scripts/fetch-kafka.sh;
#   2. `primus datagen`: two days of drifting CTR logs as hourly batch partitions + the stream
#      produced to the ctr-events topic;
#   3. the job's DAG runs DEMO_WINDOWS windows with dag.test(): per window the DataSource
#      tasks wait for the partitions and plan, mapped data tasks decode, the Joiner joins and
#      commits Arrow shards, the Sink queues the window in time order, and the trainer task
#      starts the long-running MTRM trainer (local backend) and defers until it has consumed
#      the window; per-window AUC / logloss are printed at the end.
# State lives in .primus/demo (removed at the start of each demo).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SPEC=config/jobs/ctr-demo.yaml
WINDOWS=${DEMO_WINDOWS:-4}
ROWS=${DEMO_ROWS_PER_HOUR:-2000}
BROKER=127.0.0.1:19092
CONTROLLER_PORT=19093
CACHE=${CACHE:-$HOME/.cache/primus}

export PRIMUS_HOME=$ROOT/.primus/demo
export PRIMUS_DATA=$PRIMUS_HOME/data
export AIRFLOW_HOME=$PRIMUS_HOME/airflow
export AIRFLOW__CORE__PARALLELISM=2
export PRIMUS_POLL_INTERVAL=${PRIMUS_POLL_INTERVAL:-2}
# shellcheck source=../config/airflow/env.sh
source config/airflow/env.sh
PY=$ROOT/.venv/bin/python
PRIMUS=$ROOT/.venv/bin/primus

step() { printf '\n== %s\n' "$*"; }

rm -rf "$PRIMUS_HOME"
mkdir -p "$PRIMUS_HOME" "$AIRFLOW_HOME"

for port in 19092 "$CONTROLLER_PORT"; do
  if (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
    echo "demo: 127.0.0.1:$port is already in use; stop whatever listens there (the demo starts its own Kafka on 19092 and 19093)" >&2
    exit 1
  fi
done
step "starting Apache Kafka (KRaft) on $BROKER"
KAFKA_LOG=$PRIMUS_HOME/kafka-run.log
$PY -m devstack.kafka run --port 19092 --controller-port "$CONTROLLER_PORT" --dir "$PRIMUS_HOME/kafka" \
  --cache "$CACHE" >"$KAFKA_LOG" 2>&1 &
KAFKA_PID=$!
cleanup() {
  "$PRIMUS" resources stop "$SPEC" >/dev/null 2>&1 || true
  kill -TERM "$KAFKA_PID" 2>/dev/null || true # the launcher stops the broker cleanly, then exits
  wait "$KAFKA_PID" 2>/dev/null || true
}
trap cleanup EXIT
deadline=$((SECONDS + 90))
until grep -q "ready on" "$KAFKA_LOG"; do
  if ! kill -0 "$KAFKA_PID" 2>/dev/null; then
    echo "demo: Apache Kafka failed to start; $KAFKA_LOG ends with:" >&2
  elif [ "$SECONDS" -ge "$deadline" ]; then
    echo "demo: Apache Kafka was not ready within 90 s; $KAFKA_LOG ends with:" >&2
  else
    sleep 0.2
    continue
  fi
  tail -n 20 "$KAFKA_LOG" >&2
  if [ -f "$PRIMUS_HOME/kafka/kafka.log" ]; then
    echo "-- and $PRIMUS_HOME/kafka/kafka.log:" >&2
    tail -n 20 "$PRIMUS_HOME/kafka/kafka.log" >&2
  fi
  exit 1
done
sed 's/^/  /' "$KAFKA_LOG"

step "validating $SPEC"
"$PRIMUS" validate "$SPEC"

step "generating two days of synthetic CTR logs ($ROWS impressions/hour) into $PRIMUS_DATA"
"$PRIMUS" datagen "$SPEC" --rows-per-hour "$ROWS" --kafka "$BROKER"

step "the DTGG plan of the first windows"
END=$(date -u -d "2026-11-01 00:00 UTC + $WINDOWS hours" +%Y-%m-%dT%H:%M:%SZ)
"$PRIMUS" plan "$SPEC" --dry-run --start 2026-11-01T00:00:00Z --end "$END" | head -n 20

step "preparing Airflow ($AIRFLOW_HOME, SQLite)"
"$ROOT/.venv/bin/airflow" db migrate >"$PRIMUS_HOME/airflow-migrate.log" 2>&1
$PY dags/primus_dags.py >/dev/null

step "running $WINDOWS windows of DAG ctr-demo (dag.test, trainer in service mode; log: airflow-runs.log)"
status=0
$PY -m primus_operators.local_runs --dag-id ctr-demo --windows "$WINDOWS" --mode service \
  --json "$PRIMUS_HOME/demo-report.json" >"$PRIMUS_HOME/airflow-runs.log" 2>&1 || status=$?

step "per-window results"
$PY - "$PRIMUS_HOME" <<'PY'
import json, pathlib, sys
home = pathlib.Path(sys.argv[1])
report = json.loads((home / "demo-report.json").read_text()) if (home / "demo-report.json").exists() else []
print(f"{'window':<22} {'run':<8} {'samples':>8} {'auc':>7} {'logloss':>8}")
for run in report:
    m = run.get("metrics") or {}
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else "-"
    print(f"{run['window'][:19]:<22} {run['state']:<8} {m.get('samples', '-'):>8} {fmt(m.get('auc')):>7} {fmt(m.get('logloss')):>8}")
progress_path = home / "jobs/ctr-demo/trainer/progress.json"
if progress_path.exists():
    progress = json.loads(progress_path.read_text())
    batch = [k for k in progress["consumed"] if k.startswith("history/")]
    print(f"trainer: step {progress.get('step')}, {len(batch)} batch windows and "
          f"{len(progress['consumed']) - len(batch)} stream windows consumed (trainer/progress.json)")
PY
if [ "$status" -ne 0 ]; then
  echo "demo: a window failed; see $PRIMUS_HOME/airflow-runs.log" >&2
  tail -n 30 "$PRIMUS_HOME/airflow-runs.log" >&2
  exit "$status"
fi
echo
echo "demo: done. State: $PRIMUS_HOME (report: demo-report.json, Airflow logs: airflow/logs)."
echo "Next: 'make demo DEMO_WINDOWS=24', the Airflow UI (docs/airflow.md), 'primus eval' (docs/training.md)."
