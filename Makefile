# krex: `make demo` runs the concurrent-benchmarking demo, `make test` the whole test suite.
PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
BUILD = $(CURDIR)/build

.PHONY: help demo test test-fast shim fakes venv bench-overhead reliability clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@# CPU torch for the torch Timer / Inductor hook tests; they are skipped where it cannot be had
	$(PY) -m pip install -q 'torch==2.13.0' || echo "krex: no CPU torch; the torch hook tests will be skipped"
	touch $@

venv: $(VENV)/.installed  ## create .venv with krex and its test dependencies

shim:  ## build build/libkrex.so
	$(MAKE) -C shim OUT=$(BUILD)

fakes:  ## build the fake GPU drivers and the snippet programs into build/
	$(MAKE) -C tests/fakes OUT=$(BUILD)
	$(MAKE) -C tests/snippets OUT=$(BUILD)

demo: venv shim fakes  ## run several benchmark commands at once under krex (GPU if present, else fake driver)
	$(PY) examples/demo.py

test: venv shim fakes  ## run the whole test suite (unit, integration on fake drivers, native snippets)
	$(PY) -m pytest -q -ra

test-fast: venv shim fakes  ## the suite without the slow stress tests
	$(PY) -m pytest -q -ra -m 'not slow'

bench-overhead: venv shim fakes  ## per-launch cost of the shim on the fake driver
	$(PY) bench/overhead_fake.py

reliability: venv shim fakes  ## faults, fuzzing and load on the fake driver -> bench/results/reliability.json
	$(PY) bench/reliability.py --out bench/results/reliability.json

clean:  ## remove build outputs and the venv
	rm -rf $(BUILD) $(VENV)
