# The README's commands. Each target creates the virtualenv and installs what it needs.
#   make run    materialize every asset on embedded defaults (DAGSTER_HOME=.dagster_home); SAGE_SRC=<a SAGE
#               checkout>: a live SAGE day in the model world first, beside the shipped SAGE week
#               RUN_ARGS=--cli: a `dagster asset materialize` command per step (CI), not one process
#   make sage-week SAGE_SRC=<a SAGE checkout> [DAYS=5 RUNS=40]  remake the SAGE week make run learns from
#   make test   run the test suite
#   make test-fast  the tests that need no Docker, browser or database and take under a second each, 2 workers
#   make dev    open the Dagster UI on the same instance
#   dg ...      Dagster's dg CLI on the same code location (pyproject.toml [tool.dg]), on make's instance after
#               `. .venv/bin/activate; export DAGSTER_HOME=$PWD/.dagster_home`: dg check defs, dg list defs,
#               dg launch --assets <selection>, dg dev (the UI of make dev)
#   make lint   ruff check (configured in pyproject.toml; CI runs it)
#   make config-docs  write docs/configuration.md from the pydantic configs (a test fails when it is stale)
#   make sage-contract SAGE_SRC=<a SAGE checkout>  the tests that run SAGE's own code against the project
#   make sage-loop SAGE_SRC=<a SAGE checkout> [DAYS=7 TASKS=100]  SAGE's own `sage run` against the model world, in the loop
#   make decisions-e2e SAGE_SRC=<a SAGE checkout> [NIGHTS=10 RUNS=40]  the decision ledger deciding SAGE's coder, end to end
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU-only torch. On a machine whose package index serves CUDA builds by default, set
# TORCH_PIP_ARGS="--index-url <your CPU wheel index>"; never let pip resolve torch itself.
TORCH_PIP_ARGS ?=
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export GX_ANALYTICS_ENABLED := false
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install sysdeps run test test-fast lint dev validate bench clean cluster-demo sage-contract sage-loop \
	decisions-e2e

# SAGE's source for the contract tests (CI: ../shared/upstream/sage). Set, SAGE is installed into
# .sage/venv (scripts/sage_venv.sh, never into .venv) and SAGE_PYTHON exported to the tests; unset,
# those tests are skipped and `make test` says so.
SAGE_SRC ?=
SAGE_PY = if [ -n "$(SAGE_SRC)" ]; then SAGE_PYTHON=$$(scripts/sage_venv.sh "$(SAGE_SRC)" .sage) || exit 1; \
	  export SAGE_PYTHON; echo "SAGE contract tests run against $(SAGE_SRC) ($$SAGE_PYTHON)"; \
	elif [ -z "$$SAGE_PYTHON" ]; then echo "SAGE contract tests will NOT run: SAGE_SRC is unset \
	(make test SAGE_SRC=<a SAGE checkout>)" >&2; fi

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required, found " + sys.version' 
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv failed: installing Debian's python3-venv" >&2; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); \
	  else echo "run: sudo apt-get install -y python3-venv" >&2; exit 1; fi; }
	$(BIN)/pip install -q $(TORCH_PIP_ARGS) torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	@touch $@

# System packages and services the tests need: Docker (daemon + the offline-built sandbox
# image), Chromium + chromedriver (browser test), PostgreSQL binaries (storage test).
# As root they are installed/started; otherwise the scripts print what to run.
sysdeps:
	@sim/setup_docker.sh
	@.ci/system_deps.sh

# make run with SAGE_SRC: SAGE installed into .sage/venv and SAGE_PYTHON exported, so sage_week runs a live SAGE day
SAGE_RUN_PY = if [ -n "$(SAGE_SRC)" ]; then SAGE_PYTHON=$$(scripts/sage_venv.sh "$(SAGE_SRC)" .sage) || exit 1; \
	  export SAGE_PYTHON; echo "make run: a live SAGE day in the model world first (SAGE from $(SAGE_SRC), $$SAGE_PYTHON)"; fi

run: install
	@mkdir -p $(DAGSTER_HOME)
	@sim/setup_docker.sh || echo "No Docker sandbox here: the simulator runs the project's own generated tasks in unisolated local processes (see README)." >&2
	@$(SAGE_RUN_PY); scripts/materialize_all.sh $(RUN_ARGS)
	@echo "Done. Open the UI on these runs with: make dev"

test: install sysdeps
	@$(SAGE_PY); $(BIN)/pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure here" >&2; exit 1; fi; \
	exit $$rc

# The contract suite alone: SAGE's own code (SAGE_SRC, a SAGE checkout) in a virtualenv of its own
# writes and reads the journals and loads every checkpoint kind the project writes.
sage-contract: install
	@test -n "$(SAGE_SRC)" || { echo "make sage-contract needs SAGE_SRC=<a SAGE checkout>" >&2; exit 2; }
	@$(SAGE_PY); $(BIN)/pytest -m sage_contract

# SAGE in the loop: SAGE's own `sage run` (SAGE_SRC, installed into .sage/venv) against the model world,
# DAYS days of TASKS tasks, the offline chain and its gate every night (benchmarks/sage_loop_e2e.py)
DAYS ?= 7
TASKS ?= 100
sage-loop: install
	@test -n "$(SAGE_SRC)" || { echo "make sage-loop needs SAGE_SRC=<a SAGE checkout>" >&2; exit 2; }
	$(BIN)/python benchmarks/sage_loop_e2e.py --sage-src "$(SAGE_SRC)" --days $(DAYS) --tasks $(TASKS)

# Decisions end to end (issue 47): SAGE's own `sage run` (SAGE_SRC, installed into .sage/venv) in the model world,
# NIGHTS nights of RUNS runs, the coder's model decided by the decision ledger on randomised runs, a drift
# injected, every decision beside the world's exact truth (benchmarks/decision_e2e.py)
NIGHTS ?= 10
RUNS ?= 40
decisions-e2e: install
	@test -n "$(SAGE_SRC)" || { echo "make decisions-e2e needs SAGE_SRC=<a SAGE checkout>" >&2; exit 2; }
	$(BIN)/python benchmarks/decision_e2e.py --sage-src "$(SAGE_SRC)" --nights $(NIGHTS) --runs $(RUNS)

# The SAGE week make run learns from (sage_pipeline/sage/data/sage_week.tar.xz and sage_week.json): SAGE's own
# `sage run` (SAGE_SRC, installed into .sage/venv) in the model world, DAYS days of RUNS runs (default: the script's,
# 5 x 40); only a DAYS or RUNS given on the command line or in the environment counts (other targets default them)
.PHONY: sage-week
sage-week: install
	@test -n "$(SAGE_SRC)" || { echo "make sage-week needs SAGE_SRC=<a SAGE checkout>" >&2; exit 2; }
	$(BIN)/python scripts/make_sage_week.py --sage-src "$(SAGE_SRC)" \
	  $(if $(filter command line environment,$(origin DAYS)),--days $(DAYS)) \
	  $(if $(filter command line environment,$(origin RUNS)),--runs $(RUNS))

# Everything but the tests marked docker, browser, postgres or slow (sage_pipeline_tests/conftest.py),
# in two pytest-xdist workers: under a minute on a 2-core machine, with no system services.
# `make test` and CI run everything (in one process: its fixtures start services).
test-fast: install
	$(BIN)/pytest -q -n 2 -m "not docker and not browser and not postgres and not slow"

lint: install
	$(BIN)/ruff check .

# the reaper first: a run of this instance killed earlier (kill -9) would otherwise hold its pool slot
# until its own run is launched (every run of the project's jobs reaps too: defs/run_reaper.py)
dev: install
	@mkdir -p $(DAGSTER_HOME)
	$(BIN)/python -m sage_pipeline.defs.run_reaper
	$(BIN)/dagster dev -w workspace.yaml

# Redis, a throwaway PostgreSQL and two Celery workers on loopback, the whole graph through the
# Celery executor, then everything stopped by PID (docs/scaling.md, section 2). CLUSTER_WORKERS=1
# for one worker; CLUSTER_DEMO_DIR keeps the artifacts and logs somewhere else than /tmp.
cluster-demo: install sysdeps
	scripts/cluster_demo.sh

validate: install
	$(BIN)/dagster definitions validate -w workspace.yaml

# docs/configuration.md, the configuration reference, from the pydantic models (scripts/config_reference.py);
# sage_pipeline_tests/test_config_reference.py fails when it is stale
.PHONY: config-docs
config-docs: install
	$(BIN)/python scripts/config_reference.py

clean:
	rm -rf $(VENV) *.egg-info
