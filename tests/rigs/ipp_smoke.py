"""By hand, not collected: ipyparallel's SSH engine launcher against the two-host rig.

    python -m tests.rigs.ipp_smoke      # as root, from the repository root

One engine per host over ``ssh -F <rig ssh_config>``, the controller in this (root) namespace on
the bridge address; prints how long the engines took and the rig address each engine sees.
A start for the multi-host tests: the course's SSH profile should produce the same launcher config.

The hosts share this file system, so each gets its own remote profile directory: otherwise scp
would copy the connection files onto themselves.
"""

from __future__ import annotations

import sys
import time

import ipyparallel as ipp
from traitlets.config import Config

from tests.rigs.twohosts import TwoHostRig


def engine_address() -> str:
    """The engine's IPv4 address on the rig interface, seen from inside its host."""
    import subprocess

    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "rig0"], capture_output=True,
                         text=True, timeout=5).stdout
    return out.split()[3]


def main() -> int:
    with TwoHostRig() as rig:
        profile = rig.workdir / "profile_controller"
        engines = {
            h.alias: {"n": 1, "remote_profile_dir": str(rig.workdir / f"profile_{h.name}")}
            for h in rig.hosts.values()
        }
        config = Config(
            {
                "SSHEngineSetLauncher": {
                    "engines": engines,
                    "ssh_cmd": rig.ssh_cmd,
                    "scp_cmd": rig.scp_cmd,
                    "remote_python": sys.executable,
                }
            }
        )
        cluster = ipp.Cluster(profile_dir=str(profile), cluster_id=f"rigsmoke{rig.run_id}",
                              controller_ip=rig.controller_ip, engine_launcher_class="ssh",
                              n=len(engines), config=config)
        t = time.monotonic()
        try:
            client = cluster.start_and_connect_sync(activate=False)
            client.wait_for_engines(len(engines), timeout=120)
            print(f"{len(engines)} engines up in {time.monotonic() - t:.1f} s")
            print("engine addresses:", client[:].apply_sync(engine_address))
            client.close()
        finally:
            cluster.stop_cluster_sync()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
