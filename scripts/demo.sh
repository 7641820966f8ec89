#!/usr/bin/env bash
# `make demo` (after `make up`): the ctr-demo job on the live stack, through Airflow's scheduler.
#   1. a clean slate for the job (`python -m devstack.demo reset`: earlier runs, state, data, topic);
#   2. `primus datagen`: two days of drifting CTR logs as hourly batch partitions + the event
#      stream produced to Kafka's ctr-events topic;
#   3. `primus backfill --api --wait`: DEMO_WINDOWS windows (default 12) as one Airflow backfill,
#      run by the scheduler (LocalExecutor) and triggerer: per window the DataSource sensors,
#      mapped data tasks, Joiner, Sink, the trainer task (the long-running MTRM trainer of the local
#      backend, mode service, reading the stream through the stream executors over Arrow Flight;
#      the task defers until the window is trained) and the scaler sensor;
#   4. the baselines: `primus eval` of single_tower and mtrm over the same hours (in the background);
#   5. the report: AUC/logloss per window of the live trainer and of the baseline.
# The stack stays up: the UI shows the runs; `make down` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=config/jobs/ctr-demo.yaml
WINDOWS=${DEMO_WINDOWS:-12}
ROWS=${DEMO_ROWS_PER_HOUR:-1000}
BASELINES=${DEMO_BASELINES:-single_tower,mtrm}
FIRST=2026-11-01T00:00:00Z
END=$(date -u -d "2026-11-01 00:00 UTC + $WINDOWS hours" +%Y-%m-%dT%H:%M:%SZ)
STACK=${PRIMUS_STACK_DIR:-$PWD/.primus/stack}

step() { printf '\n== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

if ! .venv/bin/python -m devstack.stack status >/dev/null 2>&1; then
  echo "demo: the live stack is not (fully) running: run \`make up\` first (or \`make demo\`, which does)" >&2
  .venv/bin/python -m devstack.stack status >&2 || true
  exit 1
fi
# shellcheck source=/dev/null
source "$STACK/env.sh"
OUT=$STACK/demo
if [ "$PRIMUS_KAFKA" != "127.0.0.1:19092" ]; then
  echo "demo: $SPEC's stream reads Kafka at 127.0.0.1:19092, but the stack's broker is $PRIMUS_KAFKA (PRIMUS_STACK_KAFKA_PORT)" >&2
  exit 2
fi
mkdir -p "$OUT"

step "validating $SPEC"
primus validate "$SPEC"

step "a clean slate for ctr-demo"
python -m devstack.demo reset "$SPEC"

step "generating two days of synthetic CTR logs ($ROWS impressions/hour) into $PRIMUS_DATA and Kafka"
primus datagen "$SPEC" --rows-per-hour "$ROWS" --kafka "$PRIMUS_KAFKA" 2>&1 | tail -n 1

step "baseline in the background: primus eval --modes $BASELINES over the same windows (log: $OUT/eval.log)"
rm -rf "$OUT/eval"
primus eval "$SPEC" --modes "$BASELINES" --seeds 0 --out "$OUT/eval" --start "$FIRST" --end "$END" \
  --eval-from "$FIRST" --quiet >"$OUT/eval.log" 2>&1 &
EVAL_PID=$!

step "backfilling $WINDOWS windows of DAG ctr-demo through the scheduler ($FIRST .. $END)"
status=0
# The API URL, user and password come from env.sh's PRIMUS_AIRFLOW_* (never argv: `ps` shows it).
primus backfill "$SPEC" --from "$FIRST" --to "$END" --mode service --wait --timeout 1200 || status=$?

step "waiting for the baseline"
eval_status=0
wait "$EVAL_PID" || eval_status=$?
if [ "$eval_status" -ne 0 ]; then
  echo "demo: primus eval failed ($eval_status); $OUT/eval.log ends with:" >&2
  tail -n 20 "$OUT/eval.log" >&2
fi

step "per-window results: MTRM (live trainer, through Airflow) and the baseline (primus eval)"
python -m devstack.demo report "$SPEC" --from "$FIRST" --to "$END" --eval "$OUT/eval" | tee "$OUT/report.txt"
if [ "$status" -ne 0 ]; then
  echo "demo: a window failed (primus backfill exited $status); task logs: $AIRFLOW_HOME/logs" >&2
  exit "$status"
fi
echo
echo "demo: done; the UI at $PRIMUS_AIRFLOW_API shows the runs (login $PRIMUS_AIRFLOW_USER, password: PRIMUS_AIRFLOW_PASSWORD in $STACK/env.sh); \`make down\` stops it."
