"""The Primus DAG files: one generated file per job spec, ``primus_jobs/<spec>.py``, made at deploy time.

``python dags/primus_dags.py`` (``make demo``, the image build, CI before committing a git-synced
DAG folder) writes one small DAG file per spec of ``$PRIMUS_JOBS_DIR`` (default ``config/jobs``)
and removes those of deleted specs; ``--check`` only reports what is out of date (exit 1).
Airflow parsing never writes: while parsed by the DAG processor this file defines no DAG and
only raises an import error naming what is out of date and the command that fixes it.

Why generated files, at deploy time:
- Airflow 3.3 keys an import error by (bundle, file) and marks *every* DAG of a file that has
  one stale (``dag_processing.collection._update_import_errors``), and a Python file yields one
  error at most. One DAG per file is the only way for a broken spec to be an import error that
  names the spec file and field while every other job keeps running.
- Files written while parsing appear only after the next folder listing (a fresh DAG processor
  found 0 DAGs on its first pass), need a writable DAG folder (a git-synced or baked-in
  Kubernetes bundle is read-only) and give parsing side effects. A custom DAG bundle that
  generates them would need bundle settings in every deployment and regeneration on every
  worker; a standard LocalDagBundle / GitDagBundle with plain files needs neither.
- Generated files are ordinary DAG code: reviewed and diffed with the specs that made them
  (commit ``primus_jobs/`` with the specs when the DAG folder is git-synced), found on the
  first parse, and identical on every host.
"""

from __future__ import annotations

import sys
from pathlib import Path

from primus_operators.dag_factory import stub_problems, sync_stubs

from primus_lib.naming import jobs_dir

HERE = Path(__file__).resolve().parent  # the DAG folder: its primus_jobs/ holds the generated files


def main(argv: list[str]) -> int:
    if "--check" in argv:
        problems = stub_problems(HERE)
        for line in problems:
            print(f"{HERE}/{line}", file=sys.stderr)
        return 1 if problems else 0
    for stub in sync_stubs(HERE):
        print(stub)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
elif _problems := stub_problems(HERE):  # parsed by Airflow's DAG processor: report, never write
    raise RuntimeError(
        f"the Primus DAG files do not match the job specs in {jobs_dir()}: {'; '.join(_problems)}. "
        "Run `python dags/primus_dags.py` (deploy step) to regenerate them"
    )
