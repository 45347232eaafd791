# krex: `make demo` runs the concurrent-benchmarking demo, `make test` the whole test suite.
PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
DEMO_VENV ?= .venv-demo
DEMO_PY = $(DEMO_VENV)/bin/python
BUILD = $(CURDIR)/build

.PHONY: help demo test test-fast shim fakes venv demo-venv bench-overhead reliability clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@# CPU torch for the torch Timer / Inductor hook tests; they are skipped where it cannot be had
	$(PY) -m pip install -q 'torch==2.13.0' || echo "krex: no CPU torch; the torch hook tests will be skipped"
	@# Ray for the fleet tests (tests/test_ray.py); they are skipped where it cannot be had
	$(PY) -m pip install -q 'ray==2.60.0' || echo "krex: no ray; the Ray tests will be skipped"
	@# cuda-python (the cuda extra): the warm workers' and bench/candidate.py --holder-gib's cuda.bindings paths, on the fake driver
	$(PY) -m pip install -q 'cuda-python>=12.6' || echo "krex: no cuda-python; its paths are tested through ctypes only"
	touch $@

venv: $(VENV)/.installed  ## create .venv with krex, its test dependencies and torch (the tests and the GPU demo use it)

# the fake-driver demo's virtualenv: krex and its own dependencies only, no torch; pip's output in a log
$(DEMO_VENV)/.installed: pyproject.toml setup.py
	@echo "krex demo: installing krex (without torch) into $(DEMO_VENV); pip's output goes to $(DEMO_VENV)/install.log"
	@$(PYTHON) -m venv $(DEMO_VENV)
	@$(DEMO_PY) -m pip install -q -e . > $(DEMO_VENV)/install.log 2>&1 || { tail -n 30 $(DEMO_VENV)/install.log; exit 1; }
	@touch $@

demo-venv: $(DEMO_VENV)/.installed  ## create .venv-demo with krex alone (what the demo on the fake driver needs)

# build/krex_ffi.py: the wire header parsed once for cffi (krex_ctl/wire/cdefs.py); by the venv's Python where
# there is one; without cffi, krex parses the header at import instead (slower, the same result). Then the
# bytecode of what `krex run` and a hooked command import, written now: where PYTHONDONTWRITEBYTECODE is set an
# interpreter reads .pyc files but writes none, and every command would compile these modules again
shim:  ## build build/libkrex.so
	$(MAKE) -C shim OUT=$(BUILD)
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON)) krex_ctl/wire/cdefs.py shim/krex_proto.h $(BUILD)/krex_ffi.py > /dev/null || true
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m compileall -q krex krex_ctl hooks $$([ -f $(BUILD)/krex_ffi.py ] && echo $(BUILD)/krex_ffi.py) > /dev/null || true

fakes:  ## build the fake GPU drivers and the snippet programs into build/
	$(MAKE) -C tests/fakes OUT=$(BUILD)
	$(MAKE) -C tests/snippets OUT=$(BUILD)

# The GPU is detected through libcuda (examples/demo.py --has-gpu, standard library only): without one, the
# demo runs on the fake driver from .venv-demo and no torch is installed; with one, from .venv (torch).
demo:  ## run several benchmark commands at once under krex: on the GPU if there is one, else on the fake driver (it says which)
	@echo "krex demo: building libkrex.so and the fake drivers (compiler output in build/demo-build.log)"
	@mkdir -p $(BUILD)
	@$(MAKE) --no-print-directory shim fakes > $(BUILD)/demo-build.log 2>&1 || { tail -n 30 $(BUILD)/demo-build.log; exit 1; }
	@if $(PYTHON) examples/demo.py --has-gpu; then \
	  echo "krex demo: a CUDA GPU answers; installing krex with torch into $(VENV) (once; output in build/demo-venv.log)"; \
	  $(MAKE) --no-print-directory venv > $(BUILD)/demo-venv.log 2>&1 || { tail -n 30 $(BUILD)/demo-venv.log; exit 1; }; \
	  $(PY) examples/demo.py; \
	else \
	  $(MAKE) -s --no-print-directory demo-venv && $(DEMO_PY) examples/demo.py; \
	fi

# the suite in TEST_WORKERS processes (pytest-xdist), each test file in one of them (--dist loadfile: a file's
# tests keep their order); the tests wait on processes, sockets and signals far more than they compute, so two
# halve the time on two cores. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST = $(PY) -m pytest -q -ra $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: venv shim fakes  ## run the whole test suite (import contracts, unit, integration on fake drivers, native snippets)
	$(VENV)/bin/lint-imports --no-cache
	$(PYTEST)

test-fast: venv shim fakes  ## the suite without the slow stress tests
	$(PYTEST) -m 'not slow'

bench-overhead: venv shim fakes  ## per-launch cost of the shim on the fake driver -> build/overhead-fake.json
	$(PY) bench/launch_overhead.py --bin $(BUILD)/snippets/spin_bench --out $(BUILD)/overhead-fake.json

reliability: venv shim fakes  ## faults, fuzzing and load on the fake driver -> bench/results/reliability.json
	$(PY) bench/reliability.py --out bench/results/reliability.json

clean:  ## remove build outputs and the venv
	rm -rf $(BUILD) $(VENV) $(DEMO_VENV)
