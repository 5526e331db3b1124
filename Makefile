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

# `make test` shares the suite between two pytest-xdist workers (one process: TEST_WORKERS=0).
# Two leave ~17% of both cores idle (tests that wait on timeouts, the hub, links); three fill it
# (91% busy) but slow collective-heavy checks most: unit 7 ex2's planted mistake then takes
# 29.5-30.8 s to fail against the catalogue's 30 s limit (3-12 s with two workers or alone).
# pyproject.toml's --dist loadfile keeps each file, and each notebook's cells, on one worker;
# a test that hangs fails after pytest-timeout's limit there, naming itself.
TEST_WORKERS ?= 2

test: install
	$(PY) -m ruff check course_utils tests conftest.py
	$(PY) -m pytest -n $(TEST_WORKERS)

# --no-compile: pip would byte-compile every module of torch and TensorFlow (most never
# imported here), about 45 s of the install; Python compiles what is imported, once, on use.
install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[test]'
	touch $(STAMP)

doctor: install
	$(VENV)/bin/course doctor

bench: install
	$(VENV)/bin/course bench startup

lint: install
	$(PY) -m ruff check course_utils tests

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
