#!/usr/bin/env bash
# `make up`: the live stack in the background (PostgreSQL, Kafka, Prometheus, Airflow's four
# processes); a second call with everything running changes nothing and prints the same
# addresses. Ports, state dir, password: see `python -m devstack.stack --help` (PRIMUS_STACK_*).
set -euo pipefail
cd "$(dirname "$0")/.."
export PRIMUS_CACHE="${PRIMUS_CACHE:-${CACHE:-$HOME/.cache/primus}}"
exec .venv/bin/python -m devstack.stack up "$@"
