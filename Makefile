# hir: `make run` and `make test` are the only commands a fresh machine needs.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-stamp
# offline model loading, no tokenizer thread storms on 2 cores
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# mkdocs-material's banner about its successor, printed on every build
export NO_MKDOCS_2_WARNING := 1

.PHONY: install run test test-slow lint bench docs docs-build redis-server chromium clean

# torch first and pinned: `pip install torch==2.13.0` takes the local CPU wheel on these
# machines (an unpinned torch pulls a multi-GB CUDA build); then the full pin set; then hir.
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -r requirements.lock
	$(PIP) install --quiet --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/hir pipeline data=completejourney

# the fast suite (a budget of 5 minutes on 2 cores; the slowest tests are listed at the end), then
# the manual's strict build: a broken link, anchor or nav entry fails. One pytest-xdist worker per
# core (PYTEST_WORKERS), each test module on one worker so its module fixtures are built once
PYTEST_WORKERS ?= 2
test: install redis-server chromium
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m "not slow" -n $(PYTEST_WORKERS) --dist loadscope --durations=10
	$(MAKE) docs-build

# the manual (mkdocs.yml, docs/): built into site/, or served with live reload on 127.0.0.1:8000.
# No --quiet: it silences the warnings before --strict counts them, so the build could not fail
# (tests/test_docs_build.py plants a broken link and sees this command fail)
docs-build: install
	$(VENV)/bin/mkdocs build --strict

docs: install
	$(VENV)/bin/mkdocs serve

test-slow: install redis-server
	$(PY) -m pytest -m slow

lint: install
	$(VENV)/bin/ruff check .

bench: install
	$(PY) benchmarks/prepare.py --quick

# The Feast Redis integration test needs Debian's redis-server; install it when absent.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (apt-get)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null \
	    || echo "warning: could not install redis-server; the Redis integration test will be skipped"; }

# The report's browser test (tests/evaluation/test_report_html.py) loads report.html in Debian's
# headless Chromium; install it when absent (the test is skipped, with that reason, without it).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (apt-get)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null \
	    || echo "warning: could not install chromium; the report's browser test will be skipped"; }

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache outputs multirun site
