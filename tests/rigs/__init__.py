"""Test rigs that simulate machines on this one (twohosts.py, slurm.py, browser.py; what they
share is in common.py). Imported as ``tests.rigs.*`` only, so each rig module exists once."""
