# The course's two commands:  make lab  (run the course)  and  make test  (run every test).
# Both create/reuse .venv and install what they need; nothing else is assumed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ENGINES ?= 2
PORT    ?= 8888
LAB_ARGS ?=

.PHONY: lab test install compiled doctor bench lint clean

lab: install compiled
	COURSE_ENGINES=$(ENGINES) $(VENV)/bin/course lab --port $(PORT) $(LAB_ARGS)

# `make test` shares the suite between two pytest-xdist workers (one process: TEST_WORKERS=0).
# Two leave ~16% of both cores idle (tests that wait on timeouts, the hub, links). Three fill
# them (93% busy; a clean run: 938 s of pytest against 1161 s with two) and, since the mistakes
# catalogue runs inside nbval's kernels, no longer crowd its timed checks (unit 7 ex2's planted
# mistake failed in 5.0 s against its 30 s limit; it took 29.5 s with three workers before);
# two stay the default until more runs with three show them steady.
# pyproject.toml's --dist loadfile keeps each file, and each notebook's cells, on one worker;
# a test that hangs fails after pytest-timeout's limit there, naming itself.
TEST_WORKERS ?= 2

test: install compiled
	$(PY) -m ruff check course_utils tests tools conftest.py
	$(PY) -m pytest -n $(TEST_WORKERS)

# The checkout's own modules, byte-compiled (only what changed): where PYTHONDONTWRITEBYTECODE
# is set, Python compiles them again in every process (kernels, engines, the course commands).
compiled: install
	$(PY) -m compileall -q -x '/(\.venv|build)/' course_utils tests tools conftest.py

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
