# The two user-facing targets: `make demo` (the CPU demo of all three arms) and `make test`.
# Both create .venv when missing: CPU torch 2.13.0 first (any other spec pulls CUDA), then
# the project with its extras (wandb: the tests run it offline).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test clean gpu-wheels gpu-twin

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

# The cp312 wheels bench/gpu_check.sh installs on a bare GPU image (bench/gpu_wheels.txt),
# into .whl/ (git-ignored); run where pip can reach the index, then carry .whl/ to the GPU.
gpu-wheels:
	$(PY) -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
	    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	    --platform manylinux2014_x86_64 -d .whl -r bench/gpu_wheels.txt

# A CPU twin of the lent GPU image's software (bench/gpu_twin.txt: Python 3.12, torch 2.11,
# transformers 5.17, ...) in .gpu-twin/ (git-ignored, about 5 GB), for the check's rehearsal
# under the image's versions, before a slot is spent (docs/gpu.md):
#   make gpu-wheels gpu-twin
#   GPU_CHECK_REHEARSAL=1 PYTHON=.gpu-twin/bin/python bash bench/gpu_check.sh
TWIN_PY ?= python3.12
gpu-twin:
	test -x .gpu-twin/bin/python || $(TWIN_PY) -m venv .gpu-twin
	.gpu-twin/bin/pip install -q -r bench/gpu_twin.txt

clean:
	rm -rf $(VENV) demo
