"""Unit 5, exercise 3: the strategy built from TF_CONFIG but without the partitioner, so no
variable is ever split."""

NOTEBOOK = "05_tf2_parameter_server_strategy.ipynb"
GRADE_ID = "ex3-solution"
BODY = """
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
"""
FAILS = "ex3-test"
MESSAGE = "pass variable_partitioner=make_partitioner(2)"
WITHIN_S = 30
