"""Unit 5, exercise 4: the step trains but never counts itself in ``steps_done``."""

NOTEBOOK = "05_tf2_parameter_server_strategy.ipynb"
GRADE_ID = "ex4-solution"
BODY = """
with tf.GradientTape() as tape:
    logits = model(x)
    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
variables = model.trainable_variables
grads = tape.gradient(loss, variables)
for var, grad in zip(variables, grads):
    var.assign_sub(LR * grad)
return loss
"""
FAILS = "ex4-test"
MESSAGE = "call steps_done.assign_add(1) in replica_fn"
WITHIN_S = 30
