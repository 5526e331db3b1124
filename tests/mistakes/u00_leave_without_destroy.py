"""leave_group that does not destroy the group: it stays alive on every rank."""

NOTEBOOK = "00_cluster_tour.ipynb"
GRADE_ID = "ex1-leave-solution"
BODY = '''
pass
'''
FAILS = "ex1-test"
MESSAGE = "call dist.destroy_process_group() in leave_group"
WITHIN_S = 15
