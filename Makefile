# The two commands of the README:
#   make demo   set everything up, then run the main job: the local-cloud demo (a job survives a spot interruption)
#   make test   set everything up, then run every check CI runs
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# `make build` is `sam build` as a deploy runs it: the SAM CLI pinned here, in its own virtual
# environment (its dependencies are not the project's), with python3.12 (the functions' runtime) on
# PATH, from pyenv when there is one. tests/integration/test_sam_build.py checks what it built.
SAM_CLI_VERSION := 1.170.0
SAM_VENV ?= .venv-sam
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12) $(shell command -v python3.12 2>/dev/null))

.PHONY: setup demo test lint typecheck template build unit bench soak clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml layers/gpujobs/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch is pinned in pyproject (2.13.0, the CPU wheel); an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet -e '.[dev,train,frameworks]'
	touch $@

demo: setup
	$(BIN)/python -m gpujobs_local.demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint training_image/Dockerfile
	# What runs on instances needs nothing newer than Python 3.9 (Amazon Linux 2023's python3); userdata.py
	# is the launch Lambda's side. tests/unit/test_userdata.py checks the shipped bytes and the loader too.
	$(BIN)/vermin --target=3.9- --no-tips --violations --exclude-regex 'userdata\.py$$' layers/gpujobs/gpujobs/instance/

typecheck: setup
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

template: setup
	.ci/check-template $(VENV)

$(SAM_VENV)/.installed:
	@test -n "$(PYTHON312)" || { echo "make build: no python3.12 (~/.pyenv/versions/3.12.* or on PATH)" >&2; exit 1; }
	$(PYTHON312) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install --quiet aws-sam-cli==$(SAM_CLI_VERSION)
	touch $@

build: $(SAM_VENV)/.installed
	PATH="$(dir $(PYTHON312)):$$PATH" SAM_CLI_TELEMETRY=0 $(SAM_VENV)/bin/sam build --template template.yaml --build-dir .aws-sam/build

unit: setup
	$(BIN)/python -m pytest -m "not integration and not training"

# -n auto: a worker per core; --dist loadgroup keeps tests/folders.py's torch group on one worker.
test: lint typecheck template build
	GPUJOBS_REQUIRE_SAM_BUILD=1 $(BIN)/python -m pytest -n auto --dist loadgroup

bench: setup
	$(BIN)/python bench/control_plane_bench.py
	$(BIN)/python bench/checkpoint_bench.py
	$(BIN)/python bench/reconciler_tick_bench.py
	$(BIN)/python bench/admission_bench.py

# The randomized proof at length: 10,000 sequences of the stateful test (CI runs a few hundred),
# then the 30-day simulated soak. Hypothesis prints how many sequences passed and how long they took.
soak: setup
	GPUJOBS_HYPOTHESIS_PROFILE=soak $(BIN)/python -m pytest -p no:cacheprovider -q --timeout 3600 --hypothesis-show-statistics \
		tests/service/test_any_order_of_events.py tests/service/test_thirty_days.py

clean:
	rm -rf $(VENV) $(SAM_VENV) .aws-sam .pytest_cache .mypy_cache .ruff_cache
