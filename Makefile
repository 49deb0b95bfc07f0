# kdelay — the two commands a user needs are `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kdelay-installed
PYTEST_ARGS ?=

.PHONY: help install constraints jvm faketime chromium kcat console-screenshots deploy-tools lint format test coverage test-spark test-unit test-integration test-e2e test-deploy demo demo-secure bench clean check-leftovers
.PHONY: containers containers-down test-containers demo-compose
.PHONY: k8s-up k8s-down test-k8s
.PHONY: spark-up
.PHONY: docs

help:
	@echo "make demo    start the local stack, send delayed messages, verify them with Spark"
	@echo "make test    install everything, lint, run every test tier"
	@echo "make coverage  make test, with the coverage of the run"
	@echo "make test-spark  the verifier on a standalone Spark cluster (tests/spark, not in make test)"
	@echo "make test-deploy  the deploy tier of make test: chart, Compose, rules, dashboards (tests/deploy)"
	@echo "make install virtualenv in $(VENV), the project with dev extras, the pinned jars"
	@echo "make lint    ruff check, ruff format --check, mypy --strict, lint-imports"
	@echo "make constraints  regenerate constraints.txt from $(VENV) (the tested versions)"
	@echo "make docs   build the manual (docs/, mkdocs.yml) into .cache/site"

# constraints.txt: the versions the suite last passed with (`make constraints`), so a fresh
# install gets them, not whatever was released since; pyproject.toml keeps the lower bounds.
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "kdelay needs Python 3.11+, found " + sys.version.split()[0] + " at $(PYTHON) (set PYTHON=...)")'
	@echo "==> creating $(VENV) and installing kdelay with dev extras"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -c constraints.txt -e '.[dev,verifier]'
	@touch $@

# Everything installed in $(VENV) but kdelay itself (pip, setuptools and wheel are left out).
constraints: $(STAMP)
	@{ echo "# The versions the suite was run with: 'make constraints' regenerates this from $(VENV)."; \
	  echo "# Used by 'make install' (pip install -c constraints.txt); pyproject.toml keeps the ranges."; \
	  $(BIN)/python -m pip freeze --exclude-editable | grep -iv '^kdelay[= @]'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	@touch $(STAMP)

install: $(STAMP) jvm faketime chromium kcat

# Debian's libfaketime: the clock-skew tests run real replicas and proxies with a skewed clock.
faketime:
	@command -v faketime >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "faketime missing: apt-get install faketime (needs root)"; exit 1; }; \
	  echo "==> apt-get install faketime (clock-skew tests)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends faketime; }

# Debian's kcat (librdkafka 2.0): tests/integration/test_proxy_sasl_kcat.py logs in through the
# proxy with an older client family (SaslHandshake v0 in ApiVersions, issue 45).
kcat:
	@command -v kcat >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "kcat missing: apt-get install kcat (needs root)"; exit 1; }; \
	  echo "==> apt-get install kcat (SASL client-family tests)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends kcat; }

# Debian's chromium and its chromedriver: tests/integration/test_console.py drives the console
# (/ui/) in a real headless browser; no browser build is downloaded.
chromium:
	@{ command -v chromium && command -v chromedriver; } >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "chromium missing: apt-get install chromium chromium-driver (needs root)"; exit 1; }; \
	  echo "==> apt-get install chromium chromium-driver (console tests)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; }

# docs/console/*.png: the console's pages, as tests/integration/test_console.py drives them.
console-screenshots: install
	KDELAY_CONSOLE_SCREENSHOTS=docs/console $(BIN)/pytest -q -p no:cacheprovider tests/integration/test_console.py

# The manual: docs/ as a site (MkDocs, the Material theme; nothing fetched). --strict: a broken
# link or anchor fails it, as tests/unit/test_docs_site.py does. Open .cache/site/index.html.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir .cache/site

jvm: $(STAMP)
	$(BIN)/kdelay jvm fetch

# helm, kubeconform, promtool, hadolint, schemas: pinned, into .cache/tools (the tests run it too).
deploy-tools: $(STAMP)
	bash dev/tools/install.sh

# .pre-commit-config.yaml runs the same four.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo --cache-dir .cache/import-linter

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# pytest exits 5 when it collected nothing; that is a failure here, never a silent pass.
# Two pytest workers (pytest-xdist), each test file on one of them, each worker with its own
# Kafka and ZooKeeper on free ports: most of the suite's time is waiting (failovers, due
# times, a cron minute), so two halve it on two cores (one run: 21 min 46 s -> 13 min 11 s).
# PYTEST_WORKERS= runs it in one process.
# `make coverage` is the same run with coverage ([tool.coverage] in pyproject.toml) of kdelay,
# proxy, delay_service, zk and verifier, as the pytest processes run them (the replicas, proxies
# and stacks the tests start as subprocesses are not measured): the files not fully covered and
# the total; no threshold. Not in `make test`: its tracer costs the suite's in-process Python
# about 75% more CPU (tests/unit: 75 s -> 138 s), minutes of a 2-core CI run's 30.
# --no-loadscope-reorder: files in collection order (tests/e2e, tests/integration, which
# tests/conftest.py puts first, then tests/deploy and the many short files of tests/packaging and
# tests/unit, which fill the end evenly), not xdist's default
# of the files with the most tests first, which left the slowest files of one or two tests (a
# Spark cluster, the wheel) to run last, one worker idle beside them for minutes.
PYTEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder
COVERAGE ?=
test: install lint
	$(BIN)/pytest $(PYTEST_WORKERS) $(COVERAGE) $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory check-leftovers

# tests/spark: the verifier on a standalone Spark cluster (five JVMs; about 5 min of a loaded
# `make test`, past CI's 30-minute budget): its own target, like test-k8s.
test-spark: install
	KDELAY_TEST_SPARK_CLUSTER=1 $(BIN)/pytest tests/spark $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory check-leftovers

coverage:
	@$(MAKE) --no-print-directory test COVERAGE="--cov --cov-report=term:skip-covered"

test-unit: $(STAMP)
	$(BIN)/pytest -m unit $(PYTEST_ARGS)

test-integration: install
	$(BIN)/pytest -m integration $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory check-leftovers

test-e2e: install
	$(BIN)/pytest -m e2e $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory check-leftovers

# The deploy tier (tests/deploy) as `make test` runs it: the chart rendered and validated, the
# Compose file and Dockerfiles, the Prometheus rules, the dashboards on a live stack; the pinned
# tools from dev/tools/install.sh. Its engine and cluster suites, tests/deploy/containers and
# tests/deploy/k8s, are deselected here: `make test-containers`, `make test-k8s`.
test-deploy: install
	$(BIN)/pytest -m deploy $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory check-leftovers

# Every JVM and service kdelay starts carries kdelay.managed=<owner pid> in its command line; one
# whose owner is gone outlived its run (dev/stack/leftovers.py).
check-leftovers: $(STAMP)
	@$(BIN)/python -m dev.stack.leftovers

demo: install
	$(BIN)/python -m dev.demo

# A standalone Spark master and two workers on loopback, in the foreground (Ctrl-C stops them);
# then `kdelay verify --spark-master <the URL it prints>` (README, Verifying on a Spark cluster).
spark-up: install
	$(BIN)/kdelay spark up --workers 2

# The same demo on `kdelay up --secure`: SASL_SSL, ACLs, a demo user allowed its topics only.
demo-secure: install
	$(BIN)/python -m dev.demo --secure

# Not part of `make test`: each starts its own servers and prints ratios against plain Kafka.
bench: install
	$(BIN)/python -m bench.proxy
	$(BIN)/python -m bench.delay_service

clean:
	rm -rf $(VENV) .cache .kdelay .mypy_cache .ruff_cache .pytest_cache

# ---- Containers (docs/containers.md); none of it is part of `make test` -------------------------
# Debian's podman and runc (apt-get, as faketime), its configuration and image storage under
# .kdelay/containers and .cache/containers, a Docker API socket, and every image built here
# (debootstrap, the pinned jars; no registry). A Docker Engine that answers is used instead.
containers: $(STAMP) jvm
	$(BIN)/python -m dev.containers up

# Removes the containers the tests and the Compose demo left, stops the socket.
containers-down: $(STAMP)
	$(BIN)/python -m dev.containers down

# The testcontainers backend. tests/deploy/containers: the e2e failover subset, the image run as
# the chart runs it, the images. CONTAINER_TESTS="tests/deploy/containers tests/integration
# tests/e2e" runs the other suites on containerised Kafka and ZooKeeper too;
# CONTAINER_IMAGES="kafka zookeeper kdelay" builds only those (all by default). The session
# starts (and stops) its own Docker API socket unless `make containers` left one running.
CONTAINER_TESTS ?= tests/deploy/containers
CONTAINER_IMAGES ?=
test-containers: $(STAMP) jvm
	$(BIN)/python -m dev.containers up --no-service --only $(CONTAINER_IMAGES)
	KDELAY_TEST_INFRA=testcontainers $(BIN)/pytest $(CONTAINER_TESTS) $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory check-leftovers

# deploy/docker/compose.yaml on the local images, the demo's burst, the demo's SLO.
demo-compose: $(STAMP) jvm
	$(BIN)/python -m dev.containers up --no-service
	$(BIN)/python -m dev.containers demo-compose

# ---- Kubernetes (docs/kubernetes.md); not part of `make test` ------------------------------------
# A real single-node cluster: etcd, the control plane, the kubelet, kube-proxy and CoreDNS built
# from the Go module proxy (once per version, .cache/k8s), Debian's containerd, runc and CNI
# plugins, state and logs in .kdelay/k8s, the project's images (make containers) loaded into
# containerd. Left running until `make k8s-down`, which leaves no process, mount or netns.
K8S_IMAGES := kdelay verifier kafka zookeeper
k8s-up: $(STAMP) jvm
	$(BIN)/python -m dev.containers up --no-service --only $(K8S_IMAGES)
	$(BIN)/python -m dev.k8s up

k8s-down: $(STAMP)
	$(BIN)/python -m dev.k8s down

# tests/deploy/k8s against that cluster (brought up first when it is not): the chart installed with
# Kafka and ZooKeeper in the cluster, delayed messages through the proxy's Service, the master's
# pod deleted mid-stream, helm upgrade and rollback, kubectl drain, helm uninstall.
test-k8s: k8s-up
	KDELAY_TEST_K8S=1 $(BIN)/pytest tests/deploy/k8s $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory check-leftovers
