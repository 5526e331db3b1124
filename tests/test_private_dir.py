"""The private runtime folder: another user who takes a name in /tmp first can neither block a
learner's start nor redirect its writes (issue: a hostile class)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from course_utils import private_dir as pd
from course_utils.cluster.engines import engine
from course_utils.cluster.launchers import fork_client


@pytest.fixture()
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A temporary folder and a home of this test's own."""
    tmp, home = tmp_path / "tmp", tmp_path / "home"
    tmp.mkdir()
    home.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return {"tmp": tmp / f"course-{os.getuid()}",
            "home": home / ".cache/dist-training-course/run"}


def test_the_folder_is_made_closed_and_reused(places: dict[str, Path]) -> None:
    got = pd.private_dir("stacks")
    assert got == places["tmp"] / "stacks"
    assert oct(got.stat().st_mode & 0o777) == "0o700"
    assert oct(places["tmp"].stat().st_mode & 0o777) == "0o700"
    assert pd.private_dir("stacks") == got


def test_an_open_folder_of_ours_is_closed(places: dict[str, Path]) -> None:
    places["tmp"].mkdir(mode=0o777)
    os.chmod(places["tmp"], 0o777)
    assert pd.private_dir() == places["tmp"]
    assert pd.is_private(places["tmp"])


def test_a_planted_symlink_or_file_moves_us_on_and_is_never_followed(
        places: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.mkdir()
    places["tmp"].symlink_to(target)
    got = pd.private_dir("engines")
    assert got == places["home"] / "engines"
    assert list(target.iterdir()) == []  # nothing was written through the link
    places["tmp"].unlink()
    places["tmp"].write_text("planted")
    assert pd.private_dir() == places["home"]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_a_folder_another_user_made_first_is_not_used(places: dict[str, Path]) -> None:
    places["tmp"].mkdir(mode=0o777)
    os.chown(places["tmp"], 65534, 65534)  # nobody's, as if a neighbour had made it
    assert not pd.is_private(places["tmp"])
    assert pd.private_dir() == places["home"]


def test_a_private_runtime_dir_comes_first(places: dict[str, Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run-user"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    assert pd.private_dir() == run / "dist-training-course"
    os.chmod(run, 0o755)  # not private: skipped
    assert pd.private_dir() == places["tmp"]


def test_no_private_place_at_all_names_the_fix(places: dict[str, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pd, "_make", lambda path: None)
    with pytest.raises(PermissionError, match="XDG_RUNTIME_DIR"):
        pd.private_dir()


def test_open_private_refuses_a_symlink(places: dict[str, Path], tmp_path: Path) -> None:
    victim = tmp_path / "notebook.ipynb"
    victim.write_text("the learner's work")
    link = pd.private_dir("stacks") / "123.txt"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        pd.open_private(link)
    assert victim.read_text() == "the learner's work"
    plain = link.with_name("124.txt")
    with pd.open_private(plain) as f:
        f.write("x")
    assert oct(plain.stat().st_mode & 0o777) == "0o600"


def test_stack_files_and_fork_sockets_live_in_the_private_folder(
        places: dict[str, Path]) -> None:
    assert Path(engine.stack_file(4242)) == places["tmp"] / "stacks" / "4242.txt"
    assert fork_client.socket_dir() == places["tmp"] / "engines"
    dead = places["tmp"] / "stacks" / "999999999.txt"
    dead.write_text("")
    assert engine.remove_stale_stack_files() >= 1
    assert not dead.exists()
