# The two commands: `make demo` (the demo on the embedded server) and `make test` (the suite).
# Both create or update the local venv from pyproject.toml by themselves.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test check test-mssql mssql-url pipeline reliability imports graph bytecode venv venv-test venv-mssql venv-spark postgres jdbc peer-pgboss peer-pgboss-if-node clean

demo: venv postgres
	$(BIN)/queuectl demo

# The suite runs in TEST_WORKERS processes (pytest-xdist), each with its own embedded server;
# tests in one xdist_group (the Spark ones) share a worker. pytest exits 5 when it collected
# no test: that is a failure here, not a pass.
TEST_WORKERS ?= 2

test: venv-test postgres jdbc bytecode peer-pgboss-if-node
	@$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

# SQL Server, live: every tests/test_mssql_live*.py (each kind, each job, health) against the
# database QUEUECTL_TEST_MSSQL_URL names, then the offline T-SQL tests; not part of `make test`
# (no SQL Server runs in CI). The venv gets the test and mssql extras (pyodbc); the ODBC driver
# is the system's (msodbcsql18: docs/sqlserver.md). A server in Docker, its database, the run:
#   docker run -e ACCEPT_EULA=Y -e MSSQL_SA_PASSWORD='Queuectl-Test-1' -p 1433:1433 -d mcr.microsoft.com/mssql/server:2022-latest
#   .venv/bin/python -c "import pyodbc; pyodbc.connect('DRIVER={ODBC Driver 18 for SQL Server};SERVER=localhost,1433;UID=sa;PWD=Queuectl-Test-1;TrustServerCertificate=yes', autocommit=True).execute('CREATE DATABASE queuectl_test')"
#   QUEUECTL_TEST_MSSQL_URL='mssql+pyodbc://sa:Queuectl-Test-1@localhost:1433/queuectl_test?driver=ODBC+Driver+18+for+SQL+Server&TrustServerCertificate=yes' make test-mssql
# Without the URL it refuses in one line (exit 2); a URL it cannot connect to, likewise.
MSSQL_LIVE_TESTS = $(sort $(wildcard tests/test_mssql_live*.py))
MSSQL_OFFLINE_TESTS = $(sort $(filter-out $(MSSQL_LIVE_TESTS),$(wildcard tests/test_mssql_*.py tests/test_tsql*.py))) \
	tests/test_jobs_upkeep.py tests/test_health_words.py

test-mssql: mssql-url venv-mssql
	@$(BIN)/python tests/mssql_live_helpers.py
	$(BIN)/python -m pytest -p no:cacheprovider -rs $(MSSQL_LIVE_TESTS) $(MSSQL_OFFLINE_TESTS) $(PYTEST_ARGS)

mssql-url:
	@if [ -z "$$QUEUECTL_TEST_MSSQL_URL" ]; then \
	  echo "make test-mssql: QUEUECTL_TEST_MSSQL_URL is not set: give it a SQL Server database URL (a server: docker run -e ACCEPT_EULA=Y -e MSSQL_SA_PASSWORD=... -p 1433:1433 -d mcr.microsoft.com/mssql/server:2022-latest; the driver, the database and the URL: docs/sqlserver.md)" >&2; \
	  exit 2; fi

# The pipeline on the embedded server: the spark extra in the venv, the JDBC jar, a demo run
# whose queue (PIPELINE_QUEUE) is kept and archived (only when that queue is not there yet),
# then export to PIPELINE_DIR/lake and the report with its charts in PIPELINE_DIR/report.
PIPELINE_DIR ?= .pipeline
PIPELINE_QUEUE ?= pipeline_demo
PIPELINE_DEMO_SECONDS ?= 60

pipeline: venv-spark postgres jdbc
	@if ! $(BIN)/queuectl list --json | grep -q '"name": "$(PIPELINE_QUEUE)"'; then \
	  $(BIN)/queuectl demo --queue $(PIPELINE_QUEUE) --seconds $(PIPELINE_DEMO_SECONDS) --keep && \
	  $(BIN)/queuectl archive $(PIPELINE_QUEUE) --min-age 0s; fi
	$(BIN)/queuectl pipeline export $(PIPELINE_QUEUE) --lake $(PIPELINE_DIR)/lake
	$(BIN)/queuectl pipeline report --lake $(PIPELINE_DIR)/lake --out $(PIPELINE_DIR)/report

# The fast subset for a change in progress: no test marked slow, none that needs Spark, not
# the fault suite (each of its scenarios loads the machine for tens of seconds).
check: venv-test postgres bytecode
	@$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow and not spark" \
	  --ignore=tests/faults $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make check: pytest collected no tests" >&2; fi; exit $$rc

# The reliability table of docs/reliability.md: the fault suite writes each scenario's ledger to
# a scratch file, which renders the table and becomes docs/reliability.json; nothing in the checkout
# changes unless every fault test passed. (The table's own test checks this target's output,
# so it does not run here.) `make test` writes no figures.
reliability: venv-test postgres
	@out=$$(mktemp) && trap 'rm -f "$$out"' EXIT && \
	  QUEUECTL_RELIABILITY_OUT="$$out" $(BIN)/python -m pytest -q -p no:cacheprovider tests/faults \
	    --ignore=tests/faults/test_reliability_table.py $(PYTEST_ARGS) && \
	  $(BIN)/python tests/faults/reliability.py "$$out" docs/reliability.md && \
	  mkdir -p docs && cp "$$out" docs/reliability.json

# The house's import rules (pyproject.toml [tool.importlinter]) over the package as installed,
# and the picture of its import graph in docs/layout.md (tests/test_architecture.py checks both).
imports: venv-test
	@$(BIN)/python tests/architecture.py lint

graph: venv-test
	@$(BIN)/python tests/architecture.py graph

# The suite starts hundreds of `queuectl` processes: compiled once here, their modules are
# not compiled again by each (Python writes no .pyc itself where PYTHONDONTWRITEBYTECODE is set).
bytecode:
	@$(BIN)/python -m compileall -q toolkit jobs migrations bench tests >/dev/null

venv: $(VENV)/.installed-base
venv-test: $(VENV)/.installed-test
venv-mssql: $(VENV)/.installed-mssql
venv-spark: $(VENV)/.installed-spark

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-base: pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[test,mssql,spark]'
	touch $@ $(VENV)/.installed-base $(VENV)/.installed-spark $(VENV)/.installed-mssql

$(VENV)/.installed-mssql: pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[test,mssql]'
	touch $@ $(VENV)/.installed-base

$(VENV)/.installed-spark: pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[spark]'
	touch $@ $(VENV)/.installed-base

# The embedded server needs PostgreSQL's server binaries (Debian's postgresql package, or
# QUEUECTL_PG_BIN pointing at a bin folder). Installed here only when missing, and only as
# root; otherwise this says what to do.
postgres:
	@if [ -n "$$QUEUECTL_PG_BIN" ] || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing PostgreSQL server binaries (apt-get install postgresql postgresql-contrib)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-contrib >/dev/null; \
	else \
	  echo "PostgreSQL server binaries not found: install postgresql and postgresql-contrib, set QUEUECTL_PG_BIN, or give QUEUECTL_URL" >&2; exit 1; \
	fi

# pg-boss, an optional peer of `queuectl bench --scenario sustained --kinds ...,pgboss`: the
# version bench/pgboss/package-lock.json pins, installed by npm ci into bench/pgboss/node_modules
# (git-ignored), from the npm registry. Needs Node and npm; pg-boss 12 asks for Node 22.12 or later
# in its engines field, which npm only warns about: the peer runs on Node 20 (docs/benchmarks.md).
# `make test` installs it too where node and npm are on PATH (npm ci takes about 5 s with an empty
# npm cache); without them its test is reported as skipped, with this command as the reason.
PGBOSS_STAMP := bench/pgboss/node_modules/.package-lock.json

peer-pgboss: $(PGBOSS_STAMP)

$(PGBOSS_STAMP): bench/pgboss/package.json bench/pgboss/package-lock.json
	@command -v node >/dev/null && command -v npm >/dev/null || \
	  { echo "make peer-pgboss: Node.js and npm are needed (apt-get install nodejs npm, or nodejs.org)" >&2; exit 2; }
	cd bench/pgboss && npm ci --no-audit --no-fund
	@touch $@

peer-pgboss-if-node:
	@if command -v node >/dev/null && command -v npm >/dev/null; then $(MAKE) --no-print-directory peer-pgboss; \
	else echo "no node/npm on PATH: the pg-boss peer is not installed and its test is skipped"; fi

# The pipeline's Spark JDBC reads need PostgreSQL's JDBC driver jar (no Maven repository is
# reachable). Looked for where the pipeline itself looks ($QUEUECTL_JDBC_JAR, /usr/share/java,
# ~/.m2: queuectl.pipeline.jdbc.find_jdbc_jar); only when none is there, Debian's
# libpostgresql-jdbc-java is installed, as root.
jdbc: venv
	@if $(BIN)/python -c "from queuectl.pipeline.jdbc import find_jdbc_jar; find_jdbc_jar('postgresql')" 2>/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing the PostgreSQL JDBC driver (apt-get install libpostgresql-jdbc-java)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java >/dev/null; \
	else \
	  echo "PostgreSQL JDBC driver not found: install libpostgresql-jdbc-java or set QUEUECTL_JDBC_JAR to the jar" >&2; exit 1; \
	fi

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
