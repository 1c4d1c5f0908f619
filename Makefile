# Two commands do all set-up on a fresh machine:
#   make demo   set up, then run the demo-scale Table 3 (10 rows) on the embedded Ding corpus and
#               write its report (runs/table3/table3-demo/report/)
#   make test   set up, then run the test suite (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup system-deps test-deps demo test test-slow bench clean

system-deps:  ## Debian packages: the Ding dictionary (the embedded default corpus)
	@if [ ! -f /usr/share/trans/de-en ]; then \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq trans-de-en >/dev/null; fi

test-deps:  ## Debian packages the tests use for real: a PostgreSQL server, Chromium and its driver, GNU time
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ ! -x /usr/bin/chromium ] \
	    || [ ! -x /usr/bin/chromedriver ] || [ ! -x /usr/bin/time ]; then \
	  { $(SUDO) apt-get update -qq && \
	    $(SUDO) apt-get install -y -qq postgresql chromium chromium-driver time >/dev/null; } || \
	  echo "test-deps: could not install postgresql/chromium/time; their tests will be skipped"; fi

$(BIN)/ablate: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --no-compile "$(TORCH)" -e ".[dev]"
	@# pip byte-compiles what it installs on one core; compileall does it on all of them, but for the
	@# packages' own test suites (18% of the code; nothing imports them) and one file of torch's
	@# tests written for Python 3.12, which pip never compiled either.
	@$(BIN)/python -m compileall -q -j 0 -x '/tests/|torch/testing/_internal/py312_intrinsics' \
	  "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null \
	  || echo "setup: some installed files did not byte-compile; Python compiles them when imported"
	@touch $@

setup: system-deps $(BIN)/ablate

WORKERS ?= 2
# make test runs the test files on this many pytest-xdist processes (one file stays on one process:
# its module fixtures are built once), longest files first (tests/conftest.py orders them; xdist's
# own reorder, by number of tests, is turned off). Three processes were no faster on 2 cores (the
# machine is busy already: benchmarks/results/test-suite-cpu-2026-11-29) and load its timed tests more
TEST_WORKERS ?= 2

demo: setup
	$(BIN)/ablate table3 --preset demo --workers $(WORKERS)

test: setup test-deps
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-slow: setup test-deps  ## the slower fault-injection cases (not in `make test`)
	$(BIN)/python -m pytest -q -m slow

bench: setup  ## benchmarks (transformers is a benchmark-only extra): JSON + markdown in benchmarks/results/
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH)" -e ".[dev,bench]"
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) runs
