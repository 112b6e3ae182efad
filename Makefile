# The two commands of the README, each installing what it needs into .venv:
#   make demo   train the seed recipes on the built-in demo data (fastrank demo)
#   make test   the whole behaviour, each thing tested once: the suite without the tests marked
#               slow or emulated (pyproject.toml's markers), the 25 slowest tests listed
# and for contributors (CONTRIBUTING.md, docs/developing.md "Tests and what each command runs"):
#   make test-slow  what is slow by nature: the tests marked slow (the repeated native builds,
#                   the seeded mutations) or emulated (the CUDA kernels on the SIMT emulator)
#   make test-all   make test, make test-slow and make test-wheel: what CI runs (.ci/run, after
#                   make lint and make docs)
#   make lint       ruff check . (ruff installed into .venv when missing; .ci/run calls it)
#   make docs       the docs site into site/ (mkdocs build --strict; .ci/run calls it too)
#   make wheel      dist/fastrank-*-manylinux_*.whl: the wheel users install (.ci/run tests it
#                   installed, in a fresh venv without a compiler: make test-wheel)
# A CPU build of torch 2.13.0 is installed into the venv only when it has no torch;
# pip is never allowed to swap that torch for another (constraint file).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.fastrank-installed
# the name of the wheel built from the current sources (make wheel)
WHEEL_FILE := dist/.wheel
SOURCES := $(shell find csrc src -type f \( -name '*.py' -o -name '*.cpp' -o -name '*.cu' -o -name '*.h' \) 2>/dev/null) \
           pyproject.toml setup.py CMakeLists.txt

.PHONY: install test test-slow test-all lint demo bench docs wheel test-wheel clean

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# The package tested is the wheel users install (make wheel, below), with the test extra: one
# native build serves make test, make demo and make test-wheel (a build from the source tree,
# `pip install .`, is what tests/test_build.py checks, in make test-slow). The wheel is
# reinstalled when it was rebuilt (same version, so the installed one is removed first: one install).
$(STAMP): $(VENV)/bin/python $(WHEEL_FILE)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > $(VENV)/constraints.txt
	$(PY) -m pip uninstall -q -y fastrank
	PIP_CONSTRAINT=$(VENV)/constraints.txt $(PY) -m pip install -q "$$(cat $(WHEEL_FILE))[test]"
	$(PY) -m pip install -q --no-deps open_clip_torch   # open_clip's loss.py for the parity tests (--no-deps: its torchvision breaks beside this torch)
	@touch $(STAMP)

# pytest (not `python -m pytest`) so that the installed package, with its native
# modules, is imported rather than the source tree. --durations=25: the slowest tests, so that
# growth shows in every run (CI's log too).
PYTEST := FASTRANK_REQUIRE_NATIVE=1 $(VENV)/bin/pytest -q --durations=25

test: install
	$(PYTEST) -m "not slow and not emulated" tests

test-slow: install
	$(PYTEST) -m "slow or emulated" tests

test-all: test test-slow test-wheel

# ruff alone (no build of fastrank), the version the test extra of pyproject.toml names
RUFF_SPEC := $(shell sed -n 's/.*"\(ruff[^"]*\)".*/\1/p' pyproject.toml | head -n 1)

lint: $(VENV)/bin/python
	@$(VENV)/bin/ruff --version >/dev/null 2>&1 || $(PY) -m pip install -q "$(RUFF_SPEC)"
	$(VENV)/bin/ruff check .

demo: install
	$(PY) -m fastrank demo

# `python benchmarks` (the folder, not -m) so the installed package with its native
# modules is imported rather than the source tree.
bench: install
	$(PY) benchmarks --quick

# The docs need no build of fastrank (the API pages are read from the source by griffe):
# only the `docs` extra of pyproject.toml is installed.
DOCS_STAMP := $(VENV)/.fastrank-docs-installed
# the requirements of one extra of pyproject.toml, one a line
EXTRA_REQS = import re; line = re.search(r"^$(1) = \[(.*)\]$$", open("pyproject.toml").read(), re.M).group(1); \
             print("\n".join(x.strip().strip(chr(34)) for x in line.split(",")))

$(DOCS_STAMP): $(VENV)/bin/python pyproject.toml
	$(PY) -c '$(call EXTRA_REQS,docs)' > $(VENV)/docs-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/docs-requirements.txt
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict

# The wheel a user receives: `pip wheel .` (every CPU level, picked at import; the CUDA module
# when nvcc is found), linked against the symbols of glibc $(WHEEL_GLIBC) (FASTRANK_GLIBC: zig's
# link stubs, the C++ runtime linked in), then `auditwheel repair --plat` gives it that
# manylinux tag, failing should any symbol need a newer glibc, and grafts any library outside
# that policy, except libgomp: the module uses the OpenMP runtime torch has already loaded
# (docs/developing.md, "Source distribution and wheels"). Only the `wheel` extra is installed,
# not fastrank. WHEEL_GLIBC: torch's own wheels are manylinux_2_28.
WHEEL_GLIBC ?= 2.28
WHEEL_PLAT  := manylinux_$(subst .,_,$(WHEEL_GLIBC))_$(shell uname -m)
WHEEL_STAMP := $(VENV)/.fastrank-wheel-tools

$(WHEEL_STAMP): $(VENV)/bin/python pyproject.toml
	$(PY) -c '$(call EXTRA_REQS,wheel)' > $(VENV)/wheel-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/wheel-requirements.txt
	@touch $(WHEEL_STAMP)

wheel: $(WHEEL_FILE)

$(WHEEL_FILE): $(WHEEL_STAMP) $(SOURCES)
	rm -rf dist/raw && mkdir -p dist
	rm -f dist/fastrank-*.whl $(WHEEL_FILE)
	FASTRANK_GLIBC=$(WHEEL_GLIBC) FASTRANK_ZIG="$$($(PY) -c 'import ziglang, pathlib; print(pathlib.Path(ziglang.__file__).with_name("zig"))')" \
	  $(PY) -m pip wheel . --no-deps -w dist/raw
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/auditwheel repair --plat $(WHEEL_PLAT) --exclude libgomp.so.1 \
	  -w dist dist/raw/fastrank-*.whl
	rm -rf dist/raw
	ls dist/fastrank-*.whl > $(WHEEL_FILE)
	@cat $(WHEEL_FILE)

# The wheel installed as a user installs it, tested: .ci/test-wheel (a fresh venv, no compiler
# on PATH, the source tree not importable: the tests marked wheel, each CPU level picked).
test-wheel: $(WHEEL_FILE)
	.ci/test-wheel "$$(cat $(WHEEL_FILE))"

clean:
	rm -rf build dist $(VENV) src/fastrank/_C_*.so demo_results site
