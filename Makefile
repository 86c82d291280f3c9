# Two commands on a fresh machine: `make demo` and `make test` (README quickstart).
# Both create .venv at the repository root when it is missing and install the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch and torchvision pinned to the builds this project is tested with.
TORCH := torch==2.14.1 torchvision==0.29.1
# inseq (the inseq bridge's tests) without its dependencies: it pins typeguard<=2.13.3, which
# transformer-lens (>=4.2) cannot share, yet never imports typeguard; the dev extra lists
# the one import of inseq's that the rest of it lacks (treescope).
INSEQ := inseq==0.7.1

.PHONY: demo readme-images test lab lint format bench zoo results clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	# setuptools says "Editable installation ... be careful with folders named like the
	# package" for every editable install with a mapped package (explain._zoo is models/);
	# pip 26 relays it as a BuildBackendWarning. It is expected here, so it is not shown.
	$(BIN)/python -W "ignore:Editable installation" -m pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps $(INSEQ)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py --out outputs/demo

# The demo, then its pictures copied over the README's (docs/images/: scripts/demo.py's
# README_IMAGES), so that they are regenerated, never hand-made.
readme-images: $(STAMP)
	$(BIN)/python scripts/demo.py --out outputs/demo --readme-images

# The whole suite in TEST_WORKERS processes (pytest-xdist), each test file's tests in one
# of them (so a file's module fixtures and caches are built once), one torch thread per
# process unless OMP_NUM_THREADS says otherwise: on 2 cores, 2 single-threaded workers
# take about half the wall time of one process. `make test TEST_WORKERS=8` on more cores;
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/ruff check explain tests scripts
	$(BIN)/ruff format --check explain tests scripts
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# JupyterLab on the notebooks, from .venv (no activation needed); installs the extra once.
lab: $(STAMP)
	$(BIN)/python -c "import jupyterlab" 2>/dev/null || \
		$(BIN)/python -W "ignore:Editable installation" -m pip install --quiet -e '.[notebooks]'
	$(BIN)/jupyter lab notebooks/

lint: $(STAMP)
	$(BIN)/ruff check explain tests scripts

format: $(STAMP)
	$(BIN)/ruff format explain tests scripts
	$(BIN)/ruff check --fix explain tests scripts

bench: $(STAMP)
	$(BIN)/python scripts/bench.py --out docs/benchmarks.md

# Retrain every zoo model from its seed, then re-measure held-out accuracy into the cards.
zoo: $(STAMP)
	$(BIN)/python scripts/train_zoo.py
	$(BIN)/python scripts/zoo_accuracy.py --update-cards

# Score every method on the zoo (resumable: finished chunks stay in outputs/results/).
results: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python scripts/results.py

clean:
	rm -rf $(VENV) outputs
