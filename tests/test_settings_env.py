"""Every ``COURSE_*`` variable is listed in ``course_utils/settings.py`` and read there only:
a maintainer finds each one, what it means and who sets it in one place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from course_utils import settings

PACKAGE = Path(settings.__file__).parent
NAME = re.compile(r"(?<=[\"'$])COURSE_[A-Z][A-Z_]*[A-Z]\b")  # in a string or a $NAME


def test_every_course_variable_the_package_names_is_listed():
    named = {m for p in PACKAGE.rglob("*.py") for m in NAME.findall(p.read_text())}
    assert named - set(settings.VARIABLES) == set()
    assert all(v.startswith(("user: ", "course: ")) for v in settings.VARIABLES.values())


def test_no_module_but_settings_reads_a_course_variable_itself():
    reads = re.compile(r"environ(?:\.get)?[\[(]\s*[\"']COURSE_|getenv\(\s*[\"']COURSE_")
    found = [f"{p.relative_to(PACKAGE)}:{n}" for p in PACKAGE.rglob("*.py") if p.name !=
             "settings.py" for n, line in enumerate(p.read_text().splitlines(), 1)
             if reads.search(line)]
    assert found == []


def test_env_reads_a_listed_variable_and_refuses_another(monkeypatch):
    monkeypatch.setenv(settings.ENV_THREADS, " 3 ")
    assert settings.env(settings.ENV_THREADS) == "3" and settings.env_threads() == 3
    assert settings.env(settings.ENV_NODE, {settings.ENV_NODE: "hostB"}) == "hostB"
    with pytest.raises(KeyError, match="not one of the course's variables"):
        settings.env("COURSE_NO_SUCH_THING")
