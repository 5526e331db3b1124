"""What the rigs share (tests/rigs/common.py): one error type, and one decision about a
missing piece: fail in CI, else skip naming the command that enables it."""

from __future__ import annotations

import pytest

from tests.rigs import browser, slurm, twohosts
from tests.rigs.common import RigError, RigUnavailable, in_ci, install_allowed, unavailable


def test_every_rig_raises_the_one_error_type():
    assert slurm.RigError is twohosts.RigError is RigError
    assert issubclass(RigUnavailable, RigError)
    err = RigError("the cause", "the fix", "LOG TAIL")
    assert str(err) == "the cause\nFix: the fix\nLOG TAIL" and err.fix == "the fix"
    assert str(RigError("only a cause")) == "only a cause"


def test_ci_is_true_in_any_case_and_allows_installing():
    for value in ("true", "True", "TRUE"):
        assert in_ci({"CI": value}) and install_allowed({"CI": value})
    assert not in_ci({}) and not in_ci({"CI": "false"}) and not in_ci({"CI": "1"})
    assert install_allowed({"COURSE_TEST_INSTALL": "1"})
    assert not install_allowed({}) and not install_allowed({"CI": "false",
                                                          "COURSE_TEST_INSTALL": "0"})


def test_a_missing_piece_skips_with_its_command_but_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"no sshd\. Enable: apt-get install x"):
        unavailable("no sshd", "apt-get install x")
    monkeypatch.setenv("CI", "True")
    with pytest.raises(pytest.fail.Exception, match="CI must run every rig: no sshd"):
        unavailable("no sshd", "apt-get install x")


def test_the_rigs_are_one_module_each():
    # tests/ is on sys.path too (pytest's rootdir-relative import of test files), so
    # `rigs.twohosts` would import a second copy with counters of its own: the suite imports
    # the rigs as tests.rigs.* only.
    import sys

    assert not [name for name in sys.modules if name.split(".")[0] == "rigs"]
    assert browser.free_port.__module__ == "course_utils.cluster.ports"


def test_every_rig_installs_through_the_one_apt_helper(tmp_path, monkeypatch):
    # The install lines each rig prints are the helper's; a failing apt-get is a RigError with
    # its output and the command to run by hand, and no policy-rc.d is left behind.
    from tests.rigs import common

    assert slurm.INSTALL_COMMAND == common.install_command(slurm.PACKAGES)
    assert twohosts.INSTALL_CMD == common.install_command(twohosts.OPENSSH_PACKAGES)
    assert "--no-install-recommends" not in common.install_command(["x"], recommends=True)
    fake = tmp_path / "apt-get"
    fake.write_text("#!/bin/sh\necho \"apt saw: $*\"\n"
                    "[ -e \"$POLICY\" ] && echo policy-present\nexit 3\n")
    fake.chmod(0o755)
    policy = tmp_path / "policy-rc.d"
    monkeypatch.setattr(common, "_POLICY", policy)
    monkeypatch.setattr(common, "_apt_updated", False)
    monkeypatch.setenv("POLICY", str(policy))
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(RigError) as caught:
        common.apt_install(["pkg-a"], timeout=30)
    text = str(caught.value)
    assert "`apt-get update -q` failed (3)" in text and "policy-present" in text, text
    assert caught.value.fix == "run by hand as root: " + common.install_command(["pkg-a"])
    assert not policy.exists()
