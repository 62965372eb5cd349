# The two commands of the README:
#   make demo   set everything up, then run the main job: the local-cloud demo (a job survives a spot interruption)
#   make test   set everything up, then run every check CI runs
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup demo test lint typecheck template unit bench soak clean

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

unit: setup
	$(BIN)/python -m pytest -m "not integration and not training"

test: lint typecheck template
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python bench/control_plane_bench.py
	$(BIN)/python bench/checkpoint_bench.py

# The randomized proof at length: 10,000 sequences of the stateful test (CI runs a few hundred),
# then the 30-day simulated soak. Hypothesis prints how many sequences passed and how long they took.
soak: setup
	GPUJOBS_HYPOTHESIS_PROFILE=soak $(BIN)/python -m pytest -p no:cacheprovider -q --timeout 3600 --hypothesis-show-statistics \
		tests/service/test_any_order_of_events.py tests/service/test_thirty_days.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
