#!/usr/bin/env bash
# Run the test suite. pytest's exit 5 ("no tests collected") is a failure here: a suite that
# ran nothing must not pass.
set -uo pipefail
cd "$(dirname "$0")/.."
export PRIMUS_CACHE=${PRIMUS_CACHE:-$HOME/.cache/primus}
.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "run-tests: pytest collected no tests" >&2
  exit 1
fi
exit $rc
