#!/usr/bin/env bash
# Create the venv and install the lock. torch is pinned to the CPU wheel that lies on disk
# (an unpinned torch would download a multi-GB CUDA build); torchrec goes in without its
# dependencies (they would drag the CUDA fbgemm-gpu). Wheels we must build (gssapi, krb5 for
# the HDFS provider) are cached in $WHEELHOUSE, outside git.
set -euo pipefail
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
WHEELHOUSE=${WHEELHOUSE:-$HOME/.cache/primus/wheels}
mkdir -p "$WHEELHOUSE"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
pip install pip==26.3
pip install torch==2.13.0
for pkg in $(grep -E '^(gssapi|krb5)==' requirements/lock.txt); do
  name=${pkg%%==*}; version=${pkg##*==}
  ls "$WHEELHOUSE"/"${name}"-"${version}"-*.whl >/dev/null 2>&1 || pip wheel --no-deps -w "$WHEELHOUSE" "$pkg"
done
pip install --find-links "$WHEELHOUSE" -r requirements/lock.txt
pip install --no-deps torchrec==1.8.0
pip install --no-deps -e .
"$VENV/bin/python" -c "import torch, torchrec, airflow, pyarrow, confluent_kafka; print('python stack ok: torch', torch.__version__)"
