"""Unit 5, exercise 4: a step that computes the loss but never applies a gradient."""

NOTEBOOK = "05_tf2_parameter_server_strategy.ipynb"
GRADE_ID = "ex4-solution"
BODY = """
logits = model(x)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
steps_done.assign_add(1)
return loss
"""
FAILS = "ex4-test"
MESSAGE = "v.assign_sub(LR * g)"
WITHIN_S = 30
