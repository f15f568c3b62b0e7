# The two user-facing targets: `make demo` (the CPU demo of all three arms) and `make test`.
# Both create .venv when missing: CPU torch 2.13.0 first (any other spec pulls CUDA), then
# the project with its extras (wandb: the tests run it offline) and megatron-core 0.16.1.
# `make test` then tests the second supported release: Python 3.12 with megatron-core 0.19.x,
# in .venv-mcore019 (torch 2.13.0 there is the CUDA build, which runs on CPU; about 5.8 GB).
# Its first leg also reads exports with other people's programs, from .venv-engines (below).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Python 3.12 for the megatron-core 0.19 leg (pyenv's 3.12.1 where pyenv provides it).
PY312 ?= PYENV_VERSION=3.12.1 python3.12
VENV19 := .venv-mcore019
STAMP19 := $(VENV19)/.installed
PYTEST := -m pytest -q -n 3 --dist loadgroup --durations=25 $(PYTEST_ARGS)
# Other people's programs that read our exports (bench/engines.txt), in their own venv: the
# engine tests run in the first leg (FIXEDCODE_ENGINES names its Python), bench/bench_engines.py
# too. llama.cpp's converter and gguf-py are taken from the llama-cpp-python sdist.
ENGINES := .venv-engines
STAMP_ENGINES := $(ENGINES)/.installed
LLAMA_CPP_PYTHON := 0.3.36

.PHONY: install engines demo demo-mcore019 test test-mcore016 test-mcore019 clean gpu-wheels gpu-twin

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[eval,dev,wandb]" "megatron-core==0.16.1"
	touch $(STAMP)

$(STAMP19): pyproject.toml
	test -x $(VENV19)/bin/python || $(PY312) -m venv $(VENV19)
	$(VENV19)/bin/pip install -q torch==2.13.0
	$(VENV19)/bin/pip install -q -e ".[eval,dev,wandb]" "megatron-core>=0.19,<0.20"
	touch $(STAMP19)

install: $(STAMP)

$(STAMP_ENGINES): bench/engines.txt
	test -x $(ENGINES)/bin/python || $(PY) -m venv $(ENGINES)
	$(ENGINES)/bin/pip install -q torch==2.13.0
	$(ENGINES)/bin/pip install -q -r bench/engines.txt
	$(ENGINES)/bin/pip download -q --no-deps --no-binary :all: -d $(ENGINES)/sdist \
	    llama-cpp-python==$(LLAMA_CPP_PYTHON)
	tar xzf $(ENGINES)/sdist/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(ENGINES) \
	    --strip-components=2 --wildcards '*/vendor/llama.cpp/convert_hf_to_gguf.py' \
	    '*/vendor/llama.cpp/conversion/*' '*/vendor/llama.cpp/gguf-py/*'
	rm -r $(ENGINES)/sdist
	touch $(STAMP_ENGINES)

engines: $(STAMP_ENGINES)

demo: $(STAMP)
	$(BIN)/python examples/cpu_demo/run_demo.py

# The demo under megatron-core 0.19.x, into demo-mcore019/ (its table is the same).
demo-mcore019: $(STAMP19)
	$(VENV19)/bin/python examples/cpu_demo/run_demo.py --workdir demo-mcore019

# Both supported releases, one after the other: megatron-core 0.16.1 (Python 3.11), then
# 0.19.x (Python 3.12), whose cross-release tests run the first leg's venv too. Three
# pytest-xdist workers for two cores: the third runs while a test waits (for Slurm's requeue, a
# held save, its processes' start-up), 5 min 5 s against 5 min 27 s with two on the first leg,
# and four were no faster. A file whose fixtures are costly is one xdist_group, run by one
# worker. The 25 slowest are printed.
test: test-mcore016 test-mcore019

test-mcore016: $(STAMP) $(STAMP_ENGINES)
	FIXEDCODE_LEG=1 FIXEDCODE_ENGINES=$(CURDIR)/$(ENGINES)/bin/python $(BIN)/python $(PYTEST)

test-mcore019: $(STAMP19) $(STAMP)
	FIXEDCODE_LEG=2 $(VENV19)/bin/python $(PYTEST)

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
	rm -rf $(VENV) $(VENV19) $(ENGINES) demo demo-mcore019
