"""Unit 6, exercise 1: node ranks from ``sorted(set(hosts))``; right only when the first host's
name sorts first (the local profile's one host, or hosts named in order)."""

NOTEBOOK = "06_two_hosts.ipynb"
GRADE_ID = "ex1-solution"
BODY = """
nodes = {h: i for i, h in enumerate(sorted(set(hosts_by_rank)))}
count, out = {}, []
for h in hosts_by_rank:
    out.append((count.get(h, 0), nodes[h]))
    count[h] = count.get(h, 0) + 1
return out
"""
FAILS = "ex1-test"
MESSAGE = "not sorted names"
WITHIN_S = 30
