# The course's two commands:  make lab  (run the course)  and  make test  (run every test).
# Both create/reuse .venv and install what they need; nothing else is assumed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ENGINES ?= 2
PORT    ?= 8888
LAB_ARGS ?=

.PHONY: lab test install doctor bench lint clean

lab: install
	COURSE_ENGINES=$(ENGINES) $(VENV)/bin/course lab --port $(PORT) $(LAB_ARGS)

# `make test` shares the suite between two pytest-xdist workers (18 min here; one process:
# TEST_WORKERS=0). conftest.py keeps a notebook, a module or a rig on one worker, and
# runs the timing-sensitive tests (units 7 and 9) alone on the machine.
TEST_WORKERS ?= 2

test: install
	$(PY) -m ruff check course_utils tests conftest.py
	$(PY) -m pytest -n $(TEST_WORKERS)

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

doctor: install
	$(VENV)/bin/course doctor

bench: install
	$(VENV)/bin/course bench startup

lint: install
	$(PY) -m ruff check course_utils tests

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
