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

system-deps:  ## Debian's trans-de-en: the Ding dictionary, the embedded corpus of the demo and the tests
	@if [ ! -f /usr/share/trans/de-en ]; then \
	  { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq trans-de-en >/dev/null; } || \
	  { echo "setup: could not install Debian's trans-de-en (the Ding corpus of make demo and make test): install it as root (apt-get install trans-de-en); make setup alone needs no Debian package (WMT14 and your own files need none)" >&2; exit 2; }; fi

test-deps:  ## Debian packages the tests use for real: PostgreSQL, Chromium and its driver, GNU time, SLURM and munge
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ ! -x /usr/bin/chromium ] \
	    || [ ! -x /usr/bin/chromedriver ] || [ ! -x /usr/bin/time ] || [ ! -x /usr/sbin/slurmctld ] \
	    || [ ! -x /usr/sbin/munged ]; then \
	  { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    $(SUDO) apt-get install -y -qq postgresql chromium chromium-driver time slurm-wlm munge >/dev/null; } || \
	  echo "test-deps: could not install postgresql/chromium/time/slurm-wlm/munge; their tests will be skipped"; fi

# Which torch the venv was set up with: a stamp named by TORCH's hash, so `make setup TORCH=torch`
# on a checkout set up with the pinned CPU torch installs again (and --upgrade takes the newer torch).
TORCH_STAMP := $(VENV)/.torch-$(shell printf '%s' '$(TORCH)' | sha1sum | cut -c1-12)

$(TORCH_STAMP):
	@mkdir -p $(VENV) && rm -f $(VENV)/.torch-* && touch $@

$(BIN)/ablate: pyproject.toml $(TORCH_STAMP)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --no-compile --upgrade "$(TORCH)" -e ".[dev]"
	@# pip byte-compiles what it installs on one core; compileall does it on all of them, but for the
	@# packages' own test suites (18% of the code; nothing imports them) and one file of torch's
	@# tests written for Python 3.12, which pip never compiled either.
	@$(BIN)/python -m compileall -q -j 0 -x '/tests/|torch/testing/_internal/py312_intrinsics' \
	  "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null \
	  || echo "setup: some installed files did not byte-compile; Python compiles them when imported"
	@touch $@

setup: $(BIN)/ablate  ## the venv and the project (no Debian package: a GPU node without sudo runs it)

WORKERS ?= 2
# make test runs the test files on this many pytest-xdist processes (one file stays on one process:
# its module fixtures are built once), longest files first (tests/conftest.py orders them; xdist's
# own reorder, by number of tests, is turned off). Three processes were no faster on 2 cores (the
# machine is busy already: benchmarks/results/test-suite-cpu-2026-11-29) and load its timed tests more
TEST_WORKERS ?= 2

demo: setup system-deps
	$(BIN)/ablate table3 --preset demo --workers $(WORKERS)

test: setup system-deps test-deps
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-slow: setup system-deps test-deps  ## the slower fault-injection cases (not in `make test`)
	$(BIN)/python -m pytest -q -m slow

bench: setup  ## benchmarks (transformers is a benchmark-only extra): JSON + markdown in benchmarks/results/
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH)" -e ".[dev,bench]"
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) runs
