# The two commands of the README: `make demo` and `make test`. Both work from a fresh clone:
# they install system packages, build what must be built (cached outside git), create .venv.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CACHE ?= $(HOME)/.cache/primus
WHEELHOUSE := $(CACHE)/wheels
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help install system test test-unit lint up down demo bench infra clean eval-worlds eval-report

help:
	@echo "make up     install, then start the live stack in the background (Airflow UI on :8080)"
	@echo "make down   stop the live stack (its state stays in .primus/stack)"
	@echo "make demo   make up, then run the ctr-demo job through Airflow's scheduler and report"
	@echo "make test   install, prepare the servers the tests start, run all tests"
	@echo "make lint   ruff and mypy (tests/test_lint.py runs them in make test)"
	@echo "make bench  run every benchmark in bench/ (BENCH_WINDOWS=500: the backfill load's windows)"
	@echo "make eval-worlds  backtest every mode on every named world (docs/eval-plan.md; hours on 2 cores)"
	@echo "make eval-report  the results table of docs/training.md from those reports"

system:
	@bash scripts/install-system.sh

$(STAMP): pyproject.toml requirements/lock.txt scripts/install-python.sh
	@$(MAKE) --no-print-directory system
	@PYTHON=$(PYTHON) VENV=$(VENV) WHEELHOUSE=$(WHEELHOUSE) bash scripts/install-python.sh
	@touch $(STAMP)

install: $(STAMP)

# The real servers the tests start: a Kubernetes control plane (built from Debian's source) with
# kwok nodes, Apache Kafka and Hadoop's minicluster (jars from Maven Central). Each step is cached
# in $(CACHE) and names itself when it fails.
infra: install
	@CACHE=$(CACHE) bash scripts/build-kube.sh
	@CACHE=$(CACHE) bash scripts/install-kwok.sh
	@CACHE=$(CACHE) bash scripts/fetch-kafka.sh
	@CACHE=$(CACHE) bash scripts/fetch-hadoop.sh

test: install infra
	@PRIMUS_CACHE=$(CACHE) bash scripts/run-tests.sh $(PYTEST_ARGS)

test-unit: install
	@bash scripts/run-tests.sh -m "not integration" $(PYTEST_ARGS)

lint: install
	@$(VENV)/bin/ruff check primus_lib plugins dags tests bench devstack
	@$(VENV)/bin/ruff format --check primus_lib plugins dags tests bench devstack
	@$(VENV)/bin/mypy

# The live stack (devstack/stack.py): PostgreSQL, Kafka, Prometheus, Airflow's four processes.
up: install
	@CACHE=$(CACHE) bash scripts/fetch-kafka.sh
	@PRIMUS_CACHE=$(CACHE) bash scripts/up.sh

down:
	@if [ -x $(PY) ]; then bash scripts/down.sh; fi

demo: up
	@bash scripts/demo.sh

# Every benchmark in turn; each one's output goes to .primus/bench/NAME.out (stderr: NAME.err), its
# last line (one JSON object) to the terminal; a failed benchmark fails the target after the others ran.
# bench/gpu_*.py need an NVIDIA GPU: skipped, and said so, where nvidia-smi finds none.
BENCH_WINDOWS ?= 500
bench: install infra
	@mkdir -p .primus/bench; failed=""; \
	for f in bench/[!_]*.py; do \
	  name=$$(basename $$f .py); echo "== $$f"; \
	  case $$name in gpu_*) if ! nvidia-smi -L >/dev/null 2>&1; then echo "skipped: no NVIDIA GPU"; continue; fi;; esac; \
	  if PRIMUS_CACHE=$(CACHE) PRIMUS_BENCH_WINDOWS=$(BENCH_WINDOWS) $(PY) $$f > .primus/bench/$$name.out 2> .primus/bench/$$name.err; \
	  then tail -1 .primus/bench/$$name.out; \
	  else tail -5 .primus/bench/$$name.err; failed="$$failed $$name"; fi; \
	done; \
	if [ -n "$$failed" ]; then echo "failed:$$failed (output in .primus/bench/)"; exit 1; fi

clean:
	rm -rf $(VENV) .primus build *.egg-info

# The results of docs/training.md: docs/eval-plan.md's protocol on every named world (EVAL_WORLDS to
# choose some), reports under .primus/eval/<world>/ (out of git), then the table rendered from them.
EVAL_DIR ?= .primus/eval
EVAL_SEEDS ?= 0,1,2
EVAL_WORLDS ?= $(shell $(PY) -c "from primus_lib.data.datagen.worlds import names; print(' '.join(names('development') + names('seen') + names('held-out')))" 2>/dev/null)
EVAL_MODES ?= mtrm;single_tower;single_tower[lr=0.01];single_tower[reread=1];online;online[lr=0.01];offline_then_online;offline_then_online[lr=0.01];offline;offline[lr=0.01];online[c=oracle];single_tower[corr=none]
eval-worlds: install
	@set -o pipefail; for w in $(EVAL_WORLDS); do echo "== $$w"; \
	  $(VENV)/bin/primus eval config/jobs/worlds-eval.yaml --world $$w --data-seeds --seeds $(EVAL_SEEDS) \
	    --end 2026-11-08T00:00:00Z --modes '$(EVAL_MODES)' --out $(EVAL_DIR)/$$w -q | tail -1 || exit 1; \
	done

eval-report: install
	@$(PY) -m primus_lib.evaluation.results $(EVAL_DIR) --write docs/training.md
