# The course's two commands:  make lab  (run the course)  and  make test  (run every test).
# Both create/reuse .venv and install what they need; nothing else is assumed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ENGINES ?= 2
PORT    ?= 8888
LAB_ARGS ?=

# Python caches each module's bytecode on first import, in the venv and the checkout, unless
# PYTHONDONTWRITEBYTECODE is set (as it is on this project's CI machines): then every process
# (kernel, engine, `course` command) compiled TensorFlow again, 11.0 s of CPU for its import
# against 4.9 s with the cache. The course's own commands run without it; compiling at install
# time instead cost 45 s of CPU, mostly for modules nothing imports.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: lab test install doctor bench lint clean mutants

lab: install
	COURSE_ENGINES=$(ENGINES) $(VENV)/bin/course lab --port $(PORT) $(LAB_ARGS)

# `make test` shares the suite between three pytest-xdist workers (one process: TEST_WORKERS=0):
# many tests wait (on timeouts, the hub, links), so two workers leave both cores partly idle,
# and four make every process slower than the cores they gain. docs/testing.md has the figures.
# pyproject.toml's --dist loadfile keeps each file, and each notebook's cells, on one worker;
# a test that hangs fails after pytest-timeout's limit there, naming itself.
TEST_WORKERS ?= 3
# Each run also plants a few mutants of the solutions, drawn anew (the seed is the run's own;
# pytest's header prints it): over many runs every quick one is tried. `make mutants` runs all.
MUTANTS_PER_RUN ?= 6

test: install
	$(PY) -m ruff check course_utils tests tools conftest.py
	COURSE_MUTANTS_PER_RUN=$(MUTANTS_PER_RUN) $(PY) -m pytest -n $(TEST_WORKERS)

# Every mutant of every solution (tools/mutation) against its exercise's visible tests, as
# nbval's run plants them (tests/notebook_items/mutants.py), then the report in docs/mutants.md.
# An instructor's check before a workshop; `make test` runs MUTANTS_PER_RUN of them.
# `make mutants UNIT=03` runs one unit's and replaces only that unit's lines of the report.
MUTANTS_OUT ?= build/mutants.jsonl
UNIT        ?=
MUTANTS_K   ?= mut_$(UNIT)

mutants: install
	mkdir -p $(dir $(MUTANTS_OUT)) && rm -f $(MUTANTS_OUT)
	-COURSE_MUTANTS_PER_EXERCISE=all COURSE_MUTANTS_OUT=$(abspath $(MUTANTS_OUT)) \
		$(PY) -m pytest -n $(TEST_WORKERS) notebooks -k "$(MUTANTS_K)" -q
	$(PY) -m tools.mutation.report $(MUTANTS_OUT) --out docs/mutants.md $(if $(UNIT),--update)

# tools/install_venv.py installs with uv, from the indexes pip is configured with (27 s for
# the whole course on a 2-core machine, where pip took 161 s), and falls back to pip.
install: $(STAMP)

$(STAMP): pyproject.toml tools/install_venv.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) tools/install_venv.py $(VENV) -e '.[test]'
	touch $(STAMP)

doctor: install
	$(VENV)/bin/course doctor

bench: install
	$(VENV)/bin/course bench startup

lint: install
	$(PY) -m ruff check course_utils tests tools

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
