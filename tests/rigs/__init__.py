"""Test rigs that simulate machines on this one (see twohosts.py). Imported by tests only."""
