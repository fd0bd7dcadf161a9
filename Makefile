# One-command setup for a fresh machine: `make test` and `make demo` install what they need, idempotently.
SHELL := /bin/bash
.DEFAULT_GOAL := test
PY_VERSION ?= 3.11
VENV := .venv
PY := $(VENV)/bin/python
BUILD := build
JARS := $(BUILD)/jars
STAMP := $(BUILD)/stamps
PROTOS := $(wildcard conductor/wire/*.proto)
PROTO_OUT := $(PROTOS:.proto=_pb2.py)
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: setup apt venv jars proto lint typecheck test test-all test-pythons faults demo doctor bench clean

setup: apt venv jars proto

# Debian packages: Java 17 for Spark, ZooKeeper's server jars, nats-server for the JetStream benchmark,
# promtool (in prometheus) to check the alerting rules, headless chromium for the conductor UI's browser test,
# a C compiler for the depot decoder's kernel (topology/spark/_flat.c).
apt: $(STAMP)/apt
$(STAMP)/apt:
	@mkdir -p $(STAMP)
	@need=""; \
	command -v java >/dev/null || need="$$need openjdk-17-jre-headless"; \
	command -v mvn >/dev/null || need="$$need maven"; \
	dpkg -s zookeeper >/dev/null 2>&1 || need="$$need zookeeper"; \
	command -v nats-server >/dev/null || need="$$need nats-server"; \
	command -v promtool >/dev/null || need="$$need prometheus"; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	command -v cc >/dev/null || need="$$need gcc"; \
	if [ -n "$$need" ]; then \
	  echo "installing Debian packages:$$need"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$need >/dev/null; \
	fi
	@java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])' || { echo "Java 17+ is required (found: $$(java -version 2>&1 | head -1))"; exit 1; }
	@touch $@

venv: $(STAMP)/venv
# requirements.lock pins the exact set the tests run; pyproject.toml declares the ranges a user's install gets.
# The editable install also builds setup.py's C extension in place: again when its source changes.
$(STAMP)/venv: pyproject.toml requirements.lock setup.py topology/spark/_flat.c
	@mkdir -p $(STAMP)
	@command -v python$(PY_VERSION) >/dev/null || { echo "python$(PY_VERSION) is required"; exit 1; }
	@[ -x $(PY) ] || python$(PY_VERSION) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements.lock -e '.[dev]'
	@touch $@

# Delta Lake's JVM jars from Maven Central, once; Spark then starts offline from build/jars.
jars: $(STAMP)/jars
$(STAMP)/jars: tools/delta-jars.pom.xml tools/zookeeper-jars.pom.xml tools/select_jars.sh $(STAMP)/venv $(STAMP)/apt
	@mkdir -p $(STAMP) $(BUILD)/maven-all
	mvn -q -B -f tools/delta-jars.pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory=$(abspath $(BUILD))/maven-all -Dmaven.repo.local=$(abspath $(BUILD))/m2
	@rm -rf $(JARS)
	tools/select_jars.sh $(BUILD)/maven-all $$($(PY) -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))') $(JARS)
	mvn -q -B -f tools/zookeeper-jars.pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	    -DoutputDirectory=$(abspath $(JARS))/zookeeper -Dmaven.repo.local=$(abspath $(BUILD))/m2
	@touch $@

proto: $(PROTO_OUT)
conductor/wire/%_pb2.py: conductor/wire/%.proto $(STAMP)/venv
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. $<

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy replog pstate topology conductor bench
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest -q

test-all: lint
	$(PY) -m pytest -q -m ''

# The unit tests on the other Pythons the dependencies support, each in its own venv under build/ with the
# locked versions (python3.X on PATH, else pyenv's; a missing one is reported and skipped).
PYTHONS ?= 3.12 3.13
test-pythons: proto
	@for v in $(PYTHONS); do \
	  py=$$(command -v python$$v 2>/dev/null); \
	  { [ -n "$$py" ] && $$py -c pass 2>/dev/null; } || py=$$(ls -d $$HOME/.pyenv/versions/$$v*/bin/python$$v 2>/dev/null | tail -1); \
	  [ -n "$$py" ] || { echo "python$$v not found: skipped"; continue; }; \
	  venv=$(BUILD)/venv-$$v; \
	  [ -x $$venv/bin/python ] || $$py -m venv $$venv || exit 1; \
	  $$venv/bin/python -m pip install -q -c requirements.lock -e '.[dev]' || exit 1; \
	  echo "unit tests on Python $$v ($$py)"; \
	  $$venv/bin/python -m pytest -q -p no:cacheprovider tests/unit || exit 1; \
	done

# The fault campaign (tests/faults/campaign, needs root): 100 seeded runs of every fault class.
faults: setup
	$(PY) -m tests.faults.campaign --runs 100 --faults all

doctor: setup
	$(VENV)/bin/conductor doctor

demo: setup
	$(PY) -m examples.demo

bench: setup
	$(PY) -m bench.replog_append --quick
	$(PY) -m bench.marks_fsync --quick
	$(PY) -m bench.pstate --quick
	$(PY) -m bench.cluster_append --quick
	$(PY) -m bench.batched_cpu --quick
	$(PY) -m bench.microbatch --quick
	$(PY) -m bench.catchup --quick
	$(PY) -m bench.topology --quick
	$(PY) -m bench.lifecycle --quick

clean:
	rm -rf $(BUILD) $(VENV) conductor/wire/*_pb2*.py conductor/wire/*_pb2*.pyi
