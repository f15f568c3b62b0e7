# The two user-facing targets: `make demo` (the CPU demo of all three arms) and `make test`.
# Both create .venv when missing: CPU torch 2.13.0 first (any other spec pulls CUDA), then
# the project with its extras (wandb: the tests run it offline).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[eval,dev,wandb]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/cpu_demo/run_demo.py

# Two workers (pytest-xdist); tests that start several processes share one worker
# (xdist_group "processes"), so they never oversubscribe two cores. The 25 slowest are printed.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) demo
