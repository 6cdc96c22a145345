# Four environments, created inside the repo and git-ignored:
#   .venv            Python 3.9 + MindSpore 2.0.0 + MSAdapter 0.1.0 (the default backend)
#   .venv-torch      Python 3.11 + torch 2.13.0 CPU (the reference backend and parity oracle)
#   .venv-mindtorch  Python 3.9 + MindSpore 2.6.0.dev20250323 (PyPI pre-release) + mindtorch 0.4.0
#   .venv-ms27       Python 3.11 + MindSpore 2.7.0 (stable) + mindnlp 0.5.1's mindtorch
# Each gets its requirements file, then this checkout installed editable (`pip install -e .`: `reid` and
# `compat` import from any folder and the acl-reid-* commands are on the environment's PATH; docs/install.md);
# it is (re)installed only when its requirements files or pyproject.toml change (a stamp file inside the venv).
SHELL := /bin/bash
PY39  ?= $(shell tools/find_python.sh 3.9)
PY311 ?= $(shell tools/find_python.sh 3.11)
MS_PY    := .venv/bin/python
TORCH_PY := .venv-torch/bin/python
MT_PY    := .venv-mindtorch/bin/python
MS27_PY  := .venv-ms27/bin/python
PYTEST_ARGS ?=
DEMO_CONFIG ?= configs/synthetic/acl.yml
PIP := -m pip install -q --disable-pip-version-check

.PHONY: test-compiled test-dist test-mindtorch test-ms27 setup demo test bench clean-venvs

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
$(eval $(call ENVIRONMENT,ms,.venv,requirements.txt,$(PY39)))
$(eval $(call ENVIRONMENT,torch,.venv-torch,requirements-torch.txt,$(PY311)))
# the largest download (docs/install.md); the exact pre-release pin in the file lets pip take it without --pre
$(eval $(call ENVIRONMENT,mindtorch,.venv-mindtorch,requirements-mindtorch.txt,$(PY39)))
# mindnlp (which ships the torch-API layer, the top-level `mindtorch`) goes in without its dependencies: its own
# pin, mindspore<=2.7.0, and its NLP dependencies are not what the layer needs (docs/install.md)
$(eval $(call ENVIRONMENT,ms27,.venv-ms27,requirements-ms27.txt,$(PY311),requirements-ms27-nodeps.txt))

setup: $(ENVIRONMENTS)

# The main job: train ACL briefly on 3 built-in synthetic domains, evaluate on the 4th (MindSpore backend).
# STACK picks the MindSpore stack: msadapter (the default: .venv, MindSpore 2.0.0), ms27 (.venv-ms27, stable
# MindSpore 2.7.0 with mindnlp's mindtorch; docs/ms27.md) or mindtorch (.venv-mindtorch, MindSpore 2.6.0.dev;
# docs/mindtorch.md); each sets up its own environment first.
STACK ?= msadapter
DEMO_STACKS := msadapter ms27 mindtorch
ifeq ($(filter $(STACK),$(DEMO_STACKS)),)
$(error unknown STACK=$(STACK); use one of: $(DEMO_STACKS))
endif
STACK_PY_msadapter := $(MS_PY)
STACK_PY_ms27 := $(MS27_PY)
STACK_PY_mindtorch := $(MT_PY)
STACK_SETUP_msadapter := setup-ms
STACK_SETUP_ms27 := setup-ms27
STACK_SETUP_mindtorch := setup-mindtorch
DEMO_PY := $(STACK_PY_$(STACK))
demo: $(STACK_SETUP_$(STACK))
	REID_BACKEND=mindspore $(DEMO_PY) train.py --config-file $(DEMO_CONFIG)

# Lint (ruff from the torch env, configured in pyproject.toml), then the suite on each stack.
# Cross-backend parity tests run from the MindSpore side and call the torch environment for the reference
# numbers; the torch run repeats the backend-neutral tests on torch.
# The MindSpore 2.7 run (ms27) repeats the MSAdapter suite but the numpy-only tests (config, datasets, samplers,
# synthetic data, transforms: they do not touch the layer and run in the MSAdapter and torch suites) and the
# docs checks, the 20-iteration step comparison (compiled against op by op and torch) and compiled execution and
# export (tests/test_compiled.py, tests/test_export.py, tests/test_compiled_ms27.py) included.
# The mindtorch 0.4 run (MindSpore 2.6.0.dev, kept while it is PyPI mindtorch's only home) repeats the tests of
# the torch-API layer itself in `make test` (MT_QUICK_TESTS: compat, model, losses, evaluation and their parity
# against torch); `make test-mindtorch` runs its whole list (MT_TESTS: compiled execution, the trainer and
# retrieval too).
# A missing environment fails the parity tests (tests/crossenv.py); the opt-out to skip them instead,
# REID_ALLOW_MISSING_BACKEND=1, is cleared here so that `make test` never passes without its references.
MT_QUICK_TESTS := tests/test_compat_checkpoint.py tests/test_compat_custom_op.py tests/test_compat_data.py \
	tests/test_compat_errors.py tests/test_compat_norm.py tests/test_compat_optim.py tests/test_compat_schedules.py \
	tests/test_losses.py tests/test_modeling.py tests/test_modeling_units.py tests/test_evaluation.py \
	tests/test_evaluation_parity.py tests/test_training_spec.py tests/test_compat_functional.py \
	tests/test_compat_shims.py tests/test_package.py
MT_TESTS := $(MT_QUICK_TESTS) tests/test_compiled.py tests/test_training.py tests/test_retrieval.py
MS27_LEFT_OUT := tests/test_config.py tests/test_datasets.py tests/test_samplers.py tests/test_synthetic.py \
	tests/test_transforms.py tests/test_docs.py tests/test_compiled_steps.py
#
# The suites queue for TEST_JOBS make jobs (2, the default: one per core), longest first, each starting when a
# job is free: the MSAdapter suite but its 20-iteration step comparison, the ms27 suite, the torch suite, the
# mindtorch one, then MSAdapter's comparison (in a process of its own). Much of each suite is one busy thread
# (MindSpore's graph builds, Python), so on 2 cores side by side takes less wall time than one after the other
# (docs/testing.md). Each suite's output is printed whole when it ends (make's --output-sync=line);
# TEST_JOBS=1 runs them one after the other, printing as it goes.
TEST_JOBS ?= 2
STEP_COMPARISON := tests/test_training.py::test_steps_match_between_backends[1-20]
SUITES := suite-msadapter suite-ms27 suite-torch suite-mindtorch suite-msadapter-steps
test: setup
	.venv-torch/bin/ruff check .
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) $(if $(filter 1,$(TEST_JOBS)),,--output-sync=line) $(SUITES)

.PHONY: $(SUITES)
suite-msadapter:
	@echo "suite: MSAdapter (MindSpore 2.0), parity against torch included, but the 20-iteration step comparison"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS_PY) -m pytest tests -q --ignore=tests/test_compiled_steps.py \
		--deselect '$(STEP_COMPARISON)' -o cache_dir=.pytest_cache/msadapter $(PYTEST_ARGS)
suite-ms27:
	@echo "suite: mindtorch (mindnlp 0.5.1) on MindSpore 2.7, parity against torch included"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS27_PY) -m pytest tests -q \
		$(addprefix --ignore=,$(MS27_LEFT_OUT)) \
		-o cache_dir=.pytest_cache/ms27 $(PYTEST_ARGS)
suite-torch:
	@echo "suite: torch"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=torch $(TORCH_PY) -m pytest tests -q -m "not parity" \
		-o cache_dir=.pytest_cache/torch $(PYTEST_ARGS)
suite-mindtorch:
	@echo "suite: mindtorch 0.4 (MindSpore 2.6.0.dev), the torch-API layer's tests"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MT_PY) -m pytest $(MT_QUICK_TESTS) -q \
		-o cache_dir=.pytest_cache/mindtorch $(PYTEST_ARGS) || test $$? -eq 5  # 5: PYTEST_ARGS='-k ...' left none
suite-msadapter-steps:
	@echo "suite: MSAdapter's 20-iteration step comparison"
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS_PY) -m pytest '$(STEP_COMPARISON)' -q \
		-o cache_dir=.pytest_cache/msadapter-steps $(PYTEST_ARGS) || test $$? -eq 5

bench: setup
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
	rm -rf .venv .venv-torch .venv-mindtorch .venv-ms27

# Compiled training steps (MODEL.JIT) with two DataParallel chunks against op-by-op MindSpore and torch (the
# single-split compiled steps, what the demo runs, are compared in `make test`): a few minutes on an idle
# 2-core machine, nearly all of it building the step graphs, which `make test` cannot afford twice.
test-compiled: setup
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MS_PY) -m pytest tests/test_compiled_steps.py -q $(PYTEST_ARGS)

# The data-parallel tests including two that `make test` skips on MindSpore to stay within its budget: the step
# comparison with compiled steps in the ranks (each rank builds its step graphs) and the kill + resume scenario
# (three 2-rank MindSpore runs); minutes each on 2 cores (docs/testing.md).
test-dist: setup
	REID_DIST_FULL=1 REID_BACKEND=mindspore $(MS_PY) -m pytest tests/test_distributed.py -q -rs $(PYTEST_ARGS)
	REID_DIST_FULL=1 REID_BACKEND=torch $(TORCH_PY) -m pytest tests/test_distributed.py -q -rs $(PYTEST_ARGS)

# The mindtorch 0.4 stack's whole list (`make test` runs its quick part).
test-mindtorch: setup-mindtorch setup-torch
	REID_ALLOW_MISSING_BACKEND= REID_BACKEND=mindspore $(MT_PY) -m pytest $(MT_TESTS) -q $(PYTEST_ARGS)

# The MindSpore 2.7 stack's part of `make test` alone.
test-ms27: setup-ms27 setup-torch
	@$(MAKE) --no-print-directory suite-ms27

# The search page's test (tests/test_serve_browser.py) drives Debian's chromium through chromium-driver. `make test`
# installs them where they are missing (as root, with apt-get) and has the torch suite fail that test, instead of
# skipping it, when the browser still cannot run.
.PHONY: browser
test: browser
suite-torch: export REID_BROWSER_TEST = 1
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "make browser: installing chromium and chromium-driver (apt-get) for the search page's test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "make browser: chromium / chromium-driver missing and cannot be installed here (not root, or no" \
		"apt-get); tests/test_serve_browser.py will fail: apt-get install chromium chromium-driver"; fi
