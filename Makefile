# Three environments, created inside the repo and git-ignored:
#   .venv            Python 3.11 + MindSpore 2.7.0 (stable) + mindnlp 0.5.1's mindtorch (the default backend)
#   .venv-torch      Python 3.11 + torch 2.13.0 CPU (the reference backend and parity oracle)
#   .venv-msadapter  Python 3.9 + MindSpore 2.0.0 + MSAdapter 0.1.0 (the legacy stack)
# Each gets its requirements file, then this checkout installed editable (`pip install -e .`: `reid` and
# `compat` import from any folder and the acl-reid-* commands are on the environment's PATH; docs/install.md);
# it is (re)installed only when its requirements files or pyproject.toml change (a stamp file inside the venv).
SHELL := /bin/bash
PY39  ?= $(shell tools/find_python.sh 3.9)
PY311 ?= $(shell tools/find_python.sh 3.11)
MS_PY    := .venv/bin/python
TORCH_PY := .venv-torch/bin/python
MSA_PY   := .venv-msadapter/bin/python
PYTEST_ARGS ?=
DEMO_CONFIG ?= configs/synthetic/acl.yml
PIP := -m pip install -q --disable-pip-version-check

.PHONY: test-compiled test-dist test-msadapter test-ms27 setup demo test bench clean-venvs

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
$(eval $(call ENVIRONMENT,msadapter,.venv-msadapter,requirements-msadapter.txt,$(PY39)))

# The environments install side by side (SETUP_JOBS of them at a time): each pip is one busy thread, mostly
# unpacking and byte-compiling, so on 2 cores three take about half the time of one after the other
# (docs/testing.md#how-long-it-takes).
SETUP_JOBS ?= 3
SIDE_BY_SIDE := $(MAKE) --no-print-directory -j$(SETUP_JOBS) --output-sync=target
setup:
	@$(SIDE_BY_SIDE) $(ENVIRONMENTS)

# The main job: train ACL briefly on 3 built-in synthetic domains, evaluate on the 4th (MindSpore backend).
# STACK picks the MindSpore stack: ms27 (the default: .venv, stable MindSpore 2.7.0 with mindnlp's mindtorch;
# docs/ms27.md) or msadapter (the legacy stack: .venv-msadapter, MindSpore 2.0.0 with MSAdapter 0.1.0); each
# sets up its own environment first.
STACK ?= ms27
DEMO_STACKS := ms27 msadapter
ifeq ($(filter $(STACK),$(DEMO_STACKS)),)
$(error unknown STACK=$(STACK); use one of: $(DEMO_STACKS))
endif
STACK_PY_ms27 := $(MS_PY)
STACK_PY_msadapter := $(MSA_PY)
STACK_SETUP_ms27 := setup-ms27
STACK_SETUP_msadapter := setup-msadapter
DEMO_PY := $(STACK_PY_$(STACK))
demo: $(STACK_SETUP_$(STACK))
	REID_BACKEND=mindspore $(DEMO_PY) train.py --config-file $(DEMO_CONFIG)

# Lint (ruff from the torch env, configured in pyproject.toml), then the suite on each stack.
# Cross-backend parity tests run from the MindSpore side and call the torch environment for the reference
# numbers; the torch run repeats the backend-neutral tests on torch.
# The default stack (.venv, MindSpore 2.7) runs the whole suite: in one process all but its two graph-heavy
# step comparisons, which run in a second one (the 20-iteration step comparison, compiled against op by op and
# torch, and tests/test_compiled_steps.py, two-chunk compiled steps against op by op).
# The legacy MSAdapter stack (.venv-msadapter, MindSpore 2.0) repeats the tests of the torch-API layer itself in
# `make test` (MSADAPTER_QUICK_TESTS: compat, model, losses, evaluation and their parity against torch, and every
# console command run as a user runs it);
# `make test-msadapter` runs its whole suite.
# A missing environment fails the parity tests (tests/crossenv.py); the opt-out to skip them instead,
# REID_ALLOW_MISSING_BACKEND=1, is cleared here so that `make test` never passes without its references.
# Besides, the tests with something to test only on the legacy stack: the helper thread's run of MindSpore 2.0's built
# graphs (compat.jit._run_built; the default stack runs the same test on its own path) and the export-name guard of
# MindSpore 2.0's graphs, which the default stack skips, and Milvus Lite 2.5 (Python 3.9's; the other environments have 3)
MSADAPTER_ONLY_TESTS := tests/test_compiled.py::test_built_graphs_run_on_the_low_priority_helper_thread \
	tests/test_compiled.py::test_graph_builds_refuse_a_switched_off_fallback_and_export_names \
	tests/test_retrieval_milvus.py::test_hnsw_on_milvus_lite_2_5_is_one_line \
	tests/test_retrieval_milvus.py::test_an_engine_that_ends_as_it_starts_is_started_again
MSADAPTER_QUICK_TESTS := tests/test_compat_allocator.py tests/test_compat_checkpoint.py tests/test_compat_custom_op.py \
	tests/test_compat_data.py tests/test_compat_errors.py tests/test_compat_norm.py tests/test_compat_optim.py \
	tests/test_compat_schedules.py \
	tests/test_losses.py tests/test_modeling.py tests/test_modeling_units.py tests/test_evaluation.py \
	tests/test_evaluation_parity.py tests/test_training_spec.py tests/test_compat_functional.py \
	tests/test_compat_shims.py tests/test_package.py tests/test_commands.py tests/test_import_order.py \
	$(MSADAPTER_ONLY_TESTS)
#
# The suites queue for TEST_JOBS make jobs (2, the default: one per core), longest first, each starting when a
# job is free: the default stack's suite but its step comparisons, the torch suite, the default stack's step
# comparisons, then the MSAdapter quick list. Much of each suite is one busy thread (MindSpore's graph builds,
# Python), so on 2 cores side by side takes less wall time than one after the other (docs/testing.md). Each
# suite's output is printed whole when it ends (make's --output-sync=line); TEST_JOBS=1 runs them one after the
# other, printing as it goes.
TEST_JOBS ?= 2
# Each suite's processes get the cores divided by the jobs running side by side (at least one) for MindSpore's
# kernel pool (REID_NUM_THREADS, compat.jit.default_threads) and torch's (OMP_NUM_THREADS): with a pool per core
# in each of two suites side by side, the cores are oversubscribed (docs/testing.md#how-long-it-takes). A value
# set by the caller wins. The legacy stack's layer tests keep MindSpore 2.0's pool per core: they run last, partly
# alone, and ran slower with one thread.
SUITE_THREADS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); t=$$((n / $(TEST_JOBS))); echo $$((t > 0 ? t : 1)))
STEP_COMPARISON := tests/test_training.py::test_steps_match_between_backends[1-20]
COMPILED_STEPS := tests/test_compiled_steps.py
SUITES := suite-ms27 suite-torch suite-ms27-steps suite-msadapter
# First the environments and the browser (below) install side by side, as `make setup` does.
test:
	@$(SIDE_BY_SIDE) $(ENVIRONMENTS) browser
	.venv-torch/bin/ruff check .
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) $(if $(filter 1,$(TEST_JOBS)),,--output-sync=line) $(SUITES)

.PHONY: $(SUITES)
$(filter-out suite-msadapter,$(SUITES)): export REID_NUM_THREADS ?= $(SUITE_THREADS)
$(filter-out suite-msadapter,$(SUITES)): export OMP_NUM_THREADS ?= $(SUITE_THREADS)
suite-ms27:
	@echo "suite: mindtorch (mindnlp 0.5.1) on MindSpore 2.7, parity against torch included, but the step comparisons"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS_PY) -m pytest tests -q --ignore=$(COMPILED_STEPS) \
		--deselect '$(STEP_COMPARISON)' -o cache_dir=.pytest_cache/ms27 $(PYTEST_ARGS)
suite-ms27-steps:
	@echo "suite: MindSpore 2.7's step comparisons (20 iterations single split; compiled steps with two chunks)"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS_PY) -m pytest '$(STEP_COMPARISON)' $(COMPILED_STEPS) -q \
		-o cache_dir=.pytest_cache/ms27-steps $(PYTEST_ARGS) || test $$? -eq 5  # 5: PYTEST_ARGS='-k ...' left none
suite-torch:
	@echo "suite: torch"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=torch $(TORCH_PY) -m pytest tests -q -m "not parity" \
		-o cache_dir=.pytest_cache/torch $(PYTEST_ARGS)
suite-msadapter:
	@echo "suite: MSAdapter (MindSpore 2.0, the legacy stack), the torch-API layer's tests"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MSA_PY) -m pytest $(MSADAPTER_QUICK_TESTS) -q \
		-o cache_dir=.pytest_cache/msadapter $(PYTEST_ARGS) || test $$? -eq 5

bench: setup-ms27 setup-torch setup-msadapter
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
	rm -rf .venv .venv-torch .venv-msadapter

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

# The legacy MSAdapter stack's whole suite (`make test` runs its quick part), parity against torch included.
test-msadapter: setup-msadapter setup-torch
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MSA_PY) -m pytest tests -q \
		-o cache_dir=.pytest_cache/msadapter-all $(PYTEST_ARGS)

# The default MindSpore 2.7 stack's part of `make test` alone.
test-ms27: setup-ms27 setup-torch
	@$(MAKE) --no-print-directory suite-ms27 suite-ms27-steps

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
