# Two environments, created inside the repo and git-ignored:
#   .venv            Python 3.11 + MindSpore 2.7.0 (stable) + mindnlp 0.5.1's mindtorch (the default backend)
#   .venv-torch      Python 3.11 + torch 2.13.0 CPU (the reference backend and parity oracle)
# Each gets its requirements file, then this checkout installed editable (`pip install -e .`: `reid` and
# `compat` import from any folder and the acl-reid-* commands are on the environment's PATH; docs/install.md);
# it is (re)installed only when its requirements files or pyproject.toml change (a stamp file inside the venv).
SHELL := /bin/bash
PY311 ?= $(shell tools/find_python.sh 3.11)
MS_PY    := .venv/bin/python
TORCH_PY := .venv-torch/bin/python
PYTEST_ARGS ?=
DEMO_CONFIG ?= configs/synthetic/acl.yml
PIP := -m pip install -q --disable-pip-version-check

.PHONY: test-compiled test-dist test-ms27 setup demo test bench clean-venvs

# $(call ENVIRONMENT,name,folder,requirements file,python[,requirements installed --no-deps]): target
# setup-<name> makes <folder> with <python>, installs the requirements and the checkout; `make setup` makes
# every environment declared so. One line each:
ENVIRONMENTS :=
define ENVIRONMENT
ENVIRONMENTS += setup-$(1)
.PHONY: setup-$(1)
setup-$(1): $(2)/.reqs-stamp
$(2)/.reqs-stamp: $(3) $(5) pyproject.toml
	@test -x $(2)/bin/python || $(4) -m venv $(2)
	$(2)/bin/python $(PIP) -r $(3)
	$(if $(5),$(2)/bin/python $(PIP) --no-deps -r $(5))
	$(2)/bin/python $(PIP) --no-deps -e .
	@touch $$@
endef
# mindnlp (which ships the torch-API layer, the top-level `mindtorch`) goes in without its dependencies: its own
# pin, mindspore<=2.7.0, and its NLP dependencies are not what the layer needs (docs/install.md)
$(eval $(call ENVIRONMENT,ms27,.venv,requirements.txt,$(PY311),requirements-nodeps.txt))
$(eval $(call ENVIRONMENT,torch,.venv-torch,requirements-torch.txt,$(PY311)))

# The legacy stack (MindSpore 2.0.0 + MSAdapter 0.1.0 on Python 3.9) was retired: asking for it is one line
# saying so, and an environment of it left from an earlier checkout is pointed out (CHANGELOG.md).
RETIRED := the legacy msadapter stack (MindSpore 2.0 + MSAdapter 0.1.0, Python 3.9) was retired; use the default \
	stack (.venv, MindSpore 2.7 with mindtorch): make demo, make test
.PHONY: setup-msadapter test-msadapter retired-env
setup-msadapter test-msadapter:
	@echo "make $@: $(RETIRED)" >&2; exit 2
retired-env:
	@if [ -d .venv-msadapter ]; then echo "note: .venv-msadapter is the retired legacy stack's environment and is" \
		"no longer used; rm -rf .venv-msadapter frees its space"; fi

# The environments install side by side (SETUP_JOBS of them at a time): each pip is one busy thread, mostly
# unpacking and byte-compiling (docs/testing.md#how-long-it-takes).
SETUP_JOBS ?= 3
SIDE_BY_SIDE := $(MAKE) --no-print-directory -j$(SETUP_JOBS) --output-sync=target
setup: retired-env
	@$(SIDE_BY_SIDE) $(ENVIRONMENTS)

# The main job: train ACL briefly on 3 built-in synthetic domains, evaluate on the 4th (MindSpore backend).
# STACK picks the MindSpore stack, which sets up its own environment first: ms27 (the default and only one
# today: .venv, stable MindSpore 2.7.0 with mindnlp's mindtorch; docs/ms27.md).
STACK ?= ms27
DEMO_STACKS := ms27
ifeq ($(STACK),msadapter)
$(error STACK=msadapter: $(RETIRED))
endif
ifeq ($(filter $(STACK),$(DEMO_STACKS)),)
$(error unknown STACK=$(STACK); use one of: $(DEMO_STACKS))
endif
STACK_PY_ms27 := $(MS_PY)
STACK_SETUP_ms27 := setup-ms27
DEMO_PY := $(STACK_PY_$(STACK))
demo: $(STACK_SETUP_$(STACK))
	REID_BACKEND=mindspore $(DEMO_PY) train.py --config-file $(DEMO_CONFIG)

# Lint (ruff from the torch env, configured in pyproject.toml), then the suite on each backend.
# Cross-backend parity tests run from the MindSpore side and call the torch environment for the reference
# numbers (one torch process per test module: tests/crossenv.py); the torch run repeats the backend-neutral
# tests on torch. The default stack (.venv, MindSpore 2.7) runs its whole suite in three processes: the main
# part; MS27_SECOND, a share of its files cut off so that the two make jobs end together; and its two
# graph-heavy step comparisons (the 20-iteration step comparison, compiled against op by op and torch, and
# tests/test_compiled_steps.py, two-chunk compiled steps against op by op). tests/test_crossenv.py checks from
# `make -n test` that together they select every test of the suite exactly once.
# A missing environment fails the parity tests (tests/crossenv.py); the opt-out to skip them instead,
# REID_ALLOW_MISSING_BACKEND=1, is cleared here so that `make test` never passes without its references.
#
# The suites queue for TEST_JOBS make jobs (2, the default: one per core), longest first, each starting when a
# job is free: the default stack's main part in one job; the torch suite, the step comparisons and
# MS27_SECOND in the other (docs/testing.md#how-long-it-takes). Much of each suite is one busy thread
# (MindSpore's graph builds, Python), so on 2 cores side by side takes less wall time than one after the other.
# Each suite's output is printed whole when it ends (make's --output-sync=line); TEST_JOBS=1 runs them one after
# the other, printing as it goes.
TEST_JOBS ?= 2
# Each suite's processes get the cores divided by the jobs running side by side (at least one) for MindSpore's
# kernel pool (REID_NUM_THREADS, compat.jit.default_threads) and torch's (OMP_NUM_THREADS): with a pool per core
# in each of two suites side by side, the cores are oversubscribed (docs/testing.md#how-long-it-takes). A value
# set by the caller wins.
SUITE_THREADS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); t=$$((n / $(TEST_JOBS))); echo $$((t > 0 ? t : 1)))
STEP_COMPARISON := tests/test_training.py::test_steps_match_between_backends[1-20]
COMPILED_STEPS := tests/test_compiled_steps.py
# the default stack's files that run in the second job, after the torch suite and the step comparisons
MS27_SECOND := tests/test_distributed.py tests/test_index_sharded.py tests/test_export.py
SUITES := suite-ms27 suite-torch suite-ms27-steps suite-ms27-second
# First the environments and the browser (below) install side by side, as `make setup` does.
test: retired-env
	@$(SIDE_BY_SIDE) $(ENVIRONMENTS) browser
	.venv-torch/bin/ruff check .
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) $(if $(filter 1,$(TEST_JOBS)),,--output-sync=line) $(SUITES)

.PHONY: $(SUITES)
$(SUITES): export REID_NUM_THREADS ?= $(SUITE_THREADS)
$(SUITES): export OMP_NUM_THREADS ?= $(SUITE_THREADS)
suite-ms27:
	@echo "suite: mindtorch (mindnlp 0.5.1) on MindSpore 2.7, parity against torch included, but MS27_SECOND and the step comparisons"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS_PY) -m pytest tests -q --ignore=$(COMPILED_STEPS) \
		$(foreach f,$(MS27_SECOND),--ignore=$(f)) --deselect '$(STEP_COMPARISON)' -o cache_dir=.pytest_cache/ms27 \
		$(PYTEST_ARGS)
suite-ms27-second:
	@echo "suite: MindSpore 2.7, the files of MS27_SECOND"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS_PY) -m pytest $(MS27_SECOND) -q \
		-o cache_dir=.pytest_cache/ms27-second $(PYTEST_ARGS) || test $$? -eq 5  # 5: PYTEST_ARGS='-k ...' left none
suite-ms27-steps:
	@echo "suite: MindSpore 2.7's step comparisons (20 iterations single split; compiled steps with two chunks)"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS_PY) -m pytest '$(STEP_COMPARISON)' $(COMPILED_STEPS) -q \
		-o cache_dir=.pytest_cache/ms27-steps $(PYTEST_ARGS) || test $$? -eq 5
suite-torch:
	@echo "suite: torch"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=torch $(TORCH_PY) -m pytest tests -q -m "not parity" \
		-o cache_dir=.pytest_cache/torch $(PYTEST_ARGS)

bench: setup-ms27 setup-torch
	REID_BACKEND=mindspore $(MS_PY) bench/model.py
	REID_BACKEND=mindspore $(MS_PY) bench/train_step.py
	REID_BACKEND=mindspore $(MS_PY) bench/kernels.py
	REID_BACKEND=mindspore $(MS_PY) bench/reductions.py
	REID_BACKEND=mindspore $(MS_PY) bench/graph_memory.py
	REID_BACKEND=mindspore $(MS_PY) bench/block_memory.py --stages 1,2,3,4
	REID_BACKEND=mindspore $(MS_PY) bench/demo_eval.py
	REID_BACKEND=mindspore $(MS_PY) bench/eval.py
	REID_BACKEND=mindspore $(MS_PY) bench/optim_step.py
	REID_BACKEND=mindspore $(MS_PY) bench/infer.py
	REID_BACKEND=mindspore $(MS_PY) bench/search.py
	REID_BACKEND=mindspore $(MS_PY) bench/index_sharded.py
	REID_BACKEND=mindspore $(MS_PY) bench/dist.py

clean-venvs:
	rm -rf .venv .venv-torch .venv-msadapter   # (the last: the retired legacy stack's, where one is left)

# Compiled training steps (MODEL.JIT) with two DataParallel chunks against op-by-op MindSpore and torch, alone
# (`make test` runs them too): a few minutes on an idle 2-core machine, nearly all of it building the step graphs.
test-compiled: setup-ms27 setup-torch
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS_PY) -m pytest $(COMPILED_STEPS) -q $(PYTEST_ARGS)

# The data-parallel tests including two that `make test` skips on MindSpore to stay within its budget: the step
# comparison with compiled steps in the ranks (each rank builds its step graphs) and the kill + resume scenario
# (three 2-rank MindSpore runs); minutes each on 2 cores (docs/testing.md).
test-dist: setup-ms27 setup-torch
	REID_DIST_FULL=1 REID_BACKEND=mindspore $(MS_PY) -m pytest tests/test_distributed.py -q -rs $(PYTEST_ARGS)
	REID_DIST_FULL=1 REID_BACKEND=torch $(TORCH_PY) -m pytest tests/test_distributed.py -q -rs $(PYTEST_ARGS)

# The default MindSpore 2.7 stack's part of `make test` alone.
test-ms27: setup-ms27 setup-torch
	@$(MAKE) --no-print-directory suite-ms27 suite-ms27-second suite-ms27-steps

# The search page's test (tests/test_serve_browser.py) drives Debian's chromium through chromium-driver. `make test`
# installs them where they are missing (as root, with apt-get) and has the torch suite fail that test, instead of
# skipping it, when the browser still cannot run.
.PHONY: browser
suite-torch: export REID_BROWSER_TEST = 1
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "make browser: installing chromium and chromium-driver (apt-get) for the search page's test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "make browser: chromium / chromium-driver missing and cannot be installed here (not root, or no" \
		"apt-get); tests/test_serve_browser.py will fail: apt-get install chromium chromium-driver"; fi
