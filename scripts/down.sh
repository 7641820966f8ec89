#!/usr/bin/env bash
# `make down`: stop the live stack (and the roles its jobs started); every piece of state stays
# in $PRIMUS_STACK_DIR (default .primus/stack) for the next `make up`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m devstack.stack down "$@"
