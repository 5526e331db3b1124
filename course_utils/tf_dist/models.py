"""The TensorFlow twin of unit 3's CNN, for part B of ``09_capstone`` (a parameter-server run of
the same task): a small ``tf.Module`` and the image layout TensorFlow's convolutions expect.

TensorFlow is imported only inside :func:`cnn`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_CLASS: dict[str, Any] = {}


def nhwc(x: np.ndarray) -> np.ndarray:
    """Course images (``data.cifar10``: float32 (N, 3, 32, 32) in [0, 1]) as TensorFlow wants
    them: (N, 32, 32, 3), scaled to [-1, 1] like unit 3's ``(x - 0.5) / 0.5``."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"expected images shaped (N, 3, H, W), found {x.shape}")
    return np.ascontiguousarray(((x - 0.5) / 0.5).transpose(0, 2, 3, 1))


def cnn(seed: int = 0) -> Any:
    """A two-convolution CNN for 32x32x3 images and 10 classes, as a ``tf.Module`` whose six
    variables get fixed seeded initial values (He scaling). Create it inside
    ``strategy.scope()`` and its variables live on the ps tasks. Calling it on a float32 batch
    (N, 32, 32, 3) returns the logits (N, 10)."""
    if "cls" not in _CLASS:
        from .quiet import quiet_tensorflow

        tf = quiet_tensorflow()

        class TinyCNN(tf.Module):
            def __init__(self, seed: int = 0) -> None:
                super().__init__(name="tiny_cnn")

                def normal(shape: list[int], k: int, fan_in: int) -> Any:
                    scale = float(np.sqrt(2.0 / fan_in))
                    return tf.random.stateless_normal(shape, seed=[seed, k]) * scale

                self.c1 = tf.Variable(normal([3, 3, 3, 16], 1, 27), name="c1")
                self.b1 = tf.Variable(tf.zeros([16]), name="b1")
                self.c2 = tf.Variable(normal([3, 3, 16, 32], 2, 144), name="c2")
                self.b2 = tf.Variable(tf.zeros([32]), name="b2")
                self.w = tf.Variable(normal([8 * 8 * 32, 10], 3, 8 * 8 * 32), name="w")
                self.b = tf.Variable(tf.zeros([10]), name="b")

            def __call__(self, x: Any) -> Any:
                h = tf.nn.relu(tf.nn.conv2d(x, self.c1, 2, "SAME") + self.b1)   # 16x16x16
                h = tf.nn.relu(tf.nn.conv2d(h, self.c2, 2, "SAME") + self.b2)   # 8x8x32
                return tf.matmul(tf.reshape(h, [-1, 8 * 8 * 32]), self.w) + self.b

        _CLASS["cls"] = TinyCNN
    return _CLASS["cls"](seed)
