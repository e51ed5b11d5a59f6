# perfpipe: `make run` runs the nightly DAG once on this machine, `make test` runs the tests.
# Both install what they need first (OS packages through apt when missing, a venv with the
# pinned Python packages, an Airflow home with its metadata DB); a second run skips that.

SHELL := /bin/bash
STATE := $(CURDIR)/.state
VENV := $(STATE)/venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.8
APT_PACKAGES := mosquitto mosquitto-clients mosquitto-dev libmosquitto-dev gcc openssh-server openssh-client iproute2 postgresql openjdk-17-jdk-headless procps util-linux activemq libmqtt-client-java chromium rabbitmq-server

export AIRFLOW_HOME := $(STATE)/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION := True
export PERFPIPE_STATE_DIR ?= $(STATE)
# The embedded default's Spark: local mode, the venv's spark-submit and Python.
export AIRFLOW_CONN_SPARK_DEFAULT ?= {"conn_type": "spark", "host": "local[*]"}
export PYSPARK_PYTHON ?= $(PY)
export PATH := $(VENV)/bin:$(PATH)

.PHONY: run airflow test lint deps os-deps venv airflow-db lock lab-up lab-down clean help

help:
	@echo "make run   - run the nightly DAG once (localhost, Mosquitto, Spark local, SQLite, Slack to file)"
	@echo "make airflow - Airflow's api-server, scheduler and dag-processor on make run's home (http://127.0.0.1:$(AIRFLOW_PORT)) until Ctrl-C"
	@echo "make test  - lint (ruff), then run the test suite on two workers (TEST_WORKERS=0: one at a time)"
	@echo "make deps  - only install OS packages, the venv and the Airflow metadata DB"
	@echo "make lab-up / lab-down - SSH test hosts in network namespaces (infra/inventories/lab.yml)"

run: deps
	$(VENV)/bin/perfpipe nightly

# The real scheduler on make run's Airflow home, until Ctrl-C: api-server (127.0.0.1 only),
# scheduler (LocalExecutor) and dag-processor; it says where the admin password is.
AIRFLOW_PORT ?= 8080
airflow: deps
	$(PY) -m tasks.airflow_glue.local_server --port $(AIRFLOW_PORT)

# The tests' DAG runs (some fail on purpose) go to an Airflow home of their own, never
# into the one `make run` and the UI use.
TEST_AIRFLOW_HOME := $(STATE)/airflow-test

# Two tests at a time (pytest-xdist): most of them wait on a stage's window, SSH or a broker's
# start. Tests marked `alone` (timing, rates, CPU cost, a stage's validity) measure by themselves, and
# tests sharing state keep to one worker: tests/parallel.py. TEST_WORKERS=0 runs one at a time.
# The groups go out in the order tests/parallel.py collects them (the alone tests last), not
# the largest first (--no-loadscope-reorder).
TEST_WORKERS ?= 2
test: lint os-deps venv $(TEST_AIRFLOW_HOME)/.migrated  # not make run's Airflow home
	AIRFLOW_HOME=$(TEST_AIRFLOW_HOME) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

deps: os-deps venv airflow-db

# The venv's pinned ruff, with the rules in pyproject.toml's [tool.ruff].
lint: venv
	$(VENV)/bin/ruff check --quiet .

lab-up: deps
	$(PY) infra/lab/lab.py up

lab-down:
	python3 infra/lab/lab.py down

# OS packages: installed through apt only when one of the commands is missing.
os-deps: $(STATE)/.os-deps
$(STATE)/.os-deps: Makefile
	@mkdir -p $(STATE)
	@missing=""; \
	  [ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null || missing="$$missing mosquitto"; \
	  [ -e /usr/include/mosquitto_plugin.h ] && [ -e /usr/include/mosquitto.h ] && command -v gcc >/dev/null || missing="$$missing mosquitto-dev"; \
	  [ -x /usr/sbin/sshd ] || missing="$$missing sshd"; \
	  command -v ip >/dev/null || missing="$$missing ip"; \
	  command -v ssh-keygen >/dev/null || missing="$$missing ssh-keygen"; \
	  command -v java >/dev/null && command -v jcmd >/dev/null || missing="$$missing java"; \
	  [ -e /usr/share/java/activemq-mqtt.jar ] && [ -e /usr/share/java/mqtt-client.jar ] || missing="$$missing activemq"; \
	  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing="$$missing rabbitmq-server"; \
	  command -v setsid >/dev/null || missing="$$missing setsid"; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing="$$missing postgresql"; \
	  if [ -n "$$missing" ]; then \
	    echo "installing OS packages (missing:$$missing)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	  fi
	@touch $@

# The venv: uv installs the exact pins of requirements.txt (the lock of pyproject.toml's
# dependencies and dev extra); the project itself is editable. uv's cache is tried first,
# offline: online, uv fetches pyspark's sdist again and builds it anew on every install
# (24 s of a fresh clone's 38 s here: the package index's replies do not let uv keep the
# download), beside the old builds (2.4 GB a venv, never reclaimed, which filled this
# machine's disk after a few dozen fresh clones), so uv's cache is pruned after. A pin
# missing from the cache (a fresh machine, a new pin) fails the offline try at once, with
# nothing installed, and the online install runs.
venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt pyproject.toml
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	@[ -x $(UV) ] || $(PY) -m pip install -q uv==$(UV_VERSION)
	VIRTUAL_ENV=$(VENV) $(UV) pip install -q --compile-bytecode --offline -r requirements.txt 2>/dev/null \
	  || VIRTUAL_ENV=$(VENV) $(UV) pip install -q --compile-bytecode -r requirements.txt
	VIRTUAL_ENV=$(VENV) $(UV) pip install -q --no-deps -e .
	$(UV) cache prune -q
	@touch $@

# An Airflow home (make run's, or the tests'): its metadata DB migrated, the lab pool set.
airflow-db: $(AIRFLOW_HOME)/.migrated
$(STATE)/%/.migrated: $(VENV)/.installed
	@mkdir -p $(@D)
	AIRFLOW_HOME=$(@D) $(VENV)/bin/airflow db migrate >$(@D)/migrate.log 2>&1 || (tail -20 $(@D)/migrate.log; exit 1)
	AIRFLOW_HOME=$(@D) $(VENV)/bin/airflow pools set perfpipe_lab 1 "lab hosts: one measurement at a time" >>$(@D)/migrate.log 2>&1
	@touch $@

# Regenerate the lock after editing the dependencies in pyproject.toml (needs the package
# registry): runtime and dev extra in one file; pins already there are kept where they fit.
lock: venv
	$(UV) pip compile pyproject.toml --extra dev --python-version 3.11 -o requirements.txt

clean:
	rm -rf $(STATE)
