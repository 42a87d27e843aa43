# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The versions the suite last passed with (constraints.txt); `make CONSTRAINTS= test` installs without them.
CONSTRAINTS ?= constraints.txt
PIP_CONSTRAINTS := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: demo test lint install clean constraints docs docs-check

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# The library alone (what `pip install avalanche-plugins` gives a user).
$(VENV)/.installed: $(VENV)/bin/python setup.cfg pyproject.toml $(CONSTRAINTS)
	$(PY) -m pip install -q $(PIP_CONSTRAINTS) -e .
	touch $@

# The study runner needs [study]; benchmarks/ (run from the checkout, not in the wheel) add GEM's QP solver.
$(VENV)/.installed-bench: $(VENV)/.installed
	$(PY) -m pip install -q $(PIP_CONSTRAINTS) -e '.[bench]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-bench
	$(PY) -m pip install -q $(PIP_CONSTRAINTS) -e '.[test,bench]'
	touch $@

install: $(VENV)/.installed

# The demo study (studies/demo.yaml): table printed, out/study/demo/report.md with its figures.
demo: $(VENV)/.installed-bench
	$(VENV)/bin/avalanche-study run studies/demo.yaml --workers 2

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .

# ATen vector kernels for the second pass of the numerical tests: on x86 `default` is never the
# machine's own (avx2 / avx512), so one machine's CI sees what a machine with other kernels computes.
SECOND_KERNELS ?= default

# Test processes (pytest-xdist): `auto` is one per core, each with its share of the cores as torch
# threads (conftest.py); `make TEST_WORKERS=0 test` runs in this process alone.
TEST_WORKERS ?= auto
XDIST := -n $(TEST_WORKERS) --dist loadgroup

# The whole suite, then the `numerical` tests (conftest.py marks them) once more under the second
# kernel set and one torch thread: tolerances that hold only on this CPU's kernels fail here.
test: lint
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)
	ATEN_CPU_CAPABILITY=$(SECOND_KERNELS) AVALANCHE_PLUGINS_TEST_THREADS=1 \
		$(PY) -m pytest $(XDIST) -q -m "numerical and not slow" $(PYTEST_ARGS)

# The documentation site (docs/conf.py): warnings are errors, the gallery executes examples/;
# `make docs-check` then opens it in headless chromium (docs/browser_check.py).
DOCS_OUT ?= out/docs/html
SPHINX_ARGS ?=

$(VENV)/.installed-docs: $(VENV)/.installed-test
	$(PY) -m pip install -q $(PIP_CONSTRAINTS) -e '.[test,bench,docs]'
	touch $@

docs: $(VENV)/.installed-docs
	$(PY) -m sphinx -b html -W --keep-going -n $(SPHINX_ARGS) docs $(DOCS_OUT)

docs-check: docs
	$(PY) docs/browser_check.py $(DOCS_OUT)

# Re-pin constraints.txt to what the venv holds now (after `make test` passed on an upgrade).
constraints: $(VENV)/.installed-test
	{ sed -n '1,/^#   make constraints/p' constraints.txt; \
	  $(PY) -m pip freeze --exclude-editable | grep -v '^avalanche-plugins'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) out *.egg-info build dist
