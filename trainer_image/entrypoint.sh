#!/usr/bin/env bash
# primus-trainer SPEC [primus train options...]
# Starts `primus train` under torchrun. Rendezvous settings come from the environment the
# resource backend sets (PRIMUS_NNODES, PRIMUS_NODE_RANK, PRIMUS_MASTER_ADDR/PORT); defaults
# give a single-node, single-process trainer. PRIMUS_NPROC ranks per node train data-parallel
# (docs/training.md, "Distributed"); a checkpoint resumes only with the same total rank count.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: primus-trainer SPEC [--until-window ID] [--max-steps N] ..." >&2
  exit 2
fi
SPEC=$1
shift
if [ ! -r "$SPEC" ]; then
  echo "primus-trainer: spec $SPEC is not readable (mount it, e.g. from a ConfigMap)" >&2
  exit 2
fi
exec torchrun \
  --nnodes="${PRIMUS_NNODES:-1}" \
  --node-rank="${PRIMUS_NODE_RANK:-0}" \
  --nproc-per-node="${PRIMUS_NPROC:-1}" \
  --master-addr="${PRIMUS_MASTER_ADDR:-127.0.0.1}" \
  --master-port="${PRIMUS_MASTER_PORT:-29500}" \
  -m primus_lib.cli.main train "$SPEC" "$@"
