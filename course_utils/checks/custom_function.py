"""The check behind unit ``10_sharding_and_memory``'s exercise 2a: the learner's first
``torch.autograd.Function``, ``ScaledMul`` (``forward(ctx, x, w, scale)`` returns
``scale * x * w``; ``backward`` returns one gradient per input of ``forward``).

It runs in the kernel (no cluster): the learner's class against autograd's own gradients of
the same expression, in double precision, on inputs of several shapes and scales, with a
random ``grad_y`` (a gradient of all ones would hide a backward that forgets it), then
``torch.autograd.gradcheck``. A wrong gradient is compared with what the usual mistakes give,
so the message names the fix.
"""

from __future__ import annotations

from typing import Any

from .feedback_format import feedback

CHECKED = "ScaledMul.apply(x, w, scale) and its backward, in float64, against autograd"
#: (shape of x and w, scale): scales that are neither 1 nor each other's inverse
CASES = (((3, 4), 2.5), ((5,), -0.5), ((2, 3, 2), 3.0))


def _error_fix(err: str) -> str:
    """What to try for an error raised by the learner's Function."""
    if "incorrect number of gradients" in err:
        return ("return one gradient per input of forward, in the same order: "
                "(grad_x, grad_w, None): None for scale, which is a number, not a tensor")
    if "not a Variable" in err or "different than None" in err:
        return ("return None for scale: it is a number, not a tensor, so it has no gradient")
    if "NotImplementedError" in err:
        return "write forward and backward where the cell says so"
    if "saved_tensors" in err or "unpack" in err:
        return ("in forward, ctx.save_for_backward(x, w); in backward, x, w = ctx.saved_tensors "
                "(the same tensors, in the order you saved them)")
    if "has no attribute" in err:
        return ("keep scale on ctx in forward (ctx.scale = scale) and read it back in "
                "backward; only tensors go through ctx.save_for_backward")
    return "read the error and the line it names"


def _wrong_grad_fix(name: str, got: Any, want: Any, unscaled: Any, no_grad_y: Any,
                    swapped: Any) -> str:
    import torch

    if torch.allclose(got, unscaled):
        return (f"{name}'s gradient lacks the factor scale: multiply by the scale you kept on "
                "ctx in forward (ctx.scale)")
    if torch.allclose(got, no_grad_y):
        return ("multiply by grad_y, the gradient of the loss with respect to forward's "
                "output: backward returns d(loss)/d(input) = grad_y * d(output)/d(input)")
    if torch.allclose(got, swapped):
        return ("ctx.saved_tensors gives back the tensors in the order you passed them to "
                "ctx.save_for_backward: x, w = ctx.saved_tensors; x's gradient is "
                "scale * grad_y * w, w's is scale * grad_y * x")
    if torch.allclose(got, -want):
        return f"check the sign of {name}'s gradient"
    return ("d(scale * x * w)/dx = scale * w and d(scale * x * w)/dw = scale * x; each "
            "times grad_y (the chain rule)")


def _one_case(cls: Any, shape: tuple[int, ...], scale: float, gen: Any) -> str | None:
    """The first problem of ``cls`` on inputs of ``shape`` with ``scale``, else ``None``."""
    import torch

    x = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(shape, dtype=torch.float64, generator=gen, requires_grad=True)
    grad_y = torch.randn(shape, dtype=torch.float64, generator=gen)
    where = f"x and w of shape {tuple(shape)}, scale={scale}"
    try:
        y = cls.apply(x, w, scale)
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
        return feedback(CHECKED, f"forward runs ({where})", err, _error_fix(err))
    want_y = scale * x * w
    if not isinstance(y, torch.Tensor) or y.shape != want_y.shape or not torch.allclose(
            y, want_y):
        return feedback(CHECKED, f"forward returns scale * x * w ({where})",
                        f"{y!r}"[:200], "return scale * x * w from forward")
    saved = getattr(y.grad_fn, "saved_tensors", ())
    if not (len(saved) == 2 and saved[0] is not None and torch.equal(saved[0], x)
            and torch.equal(saved[1], w)):
        return feedback(CHECKED, "forward saves x and w with ctx.save_for_backward(x, w)",
                        f"{len(saved)} tensor(s) saved that way", "call "
                        "ctx.save_for_backward(x, w) in forward (not ctx.x = x): autograd then "
                        "keeps them for backward and checks nothing changed them in between")
    try:
        got = torch.autograd.grad(y, (x, w), grad_y, allow_unused=True)
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
        return feedback(CHECKED, f"backward runs ({where})", err, _error_fix(err))
    want = torch.autograd.grad(want_y, (x, w), grad_y)
    x0, w0 = x.detach(), w.detach()
    for name, g, ref, other, self_ in (("x", got[0], want[0], w0, x0),
                                       ("w", got[1], want[1], x0, w0)):
        if g is None:
            return feedback(CHECKED, f"a gradient for {name} ({where})", "None",
                            f"return a tensor for {name}: None is only for an input that is "
                            "not a tensor (scale); the order is (grad_x, grad_w, None)")
        if g.shape != ref.shape or not torch.allclose(g, ref):
            return feedback(CHECKED, f"{name}'s gradient equal to autograd's ({where})",
                            f"a largest difference of {float((g - ref).abs().max()):.3g}",
                            _wrong_grad_fix(name, g, ref, grad_y * other, scale * other,
                                            scale * grad_y * self_))
    return None


def function_problem(cls: Any) -> str | None:
    """The first problem of the learner's ``cls`` (``ScaledMul``), as a checked/expected/
    found/try message; ``None`` when forward, backward and ``gradcheck`` agree with autograd."""
    import torch

    gen = torch.Generator().manual_seed(10)
    for shape, scale in CASES:
        problem = _one_case(cls, shape, scale, gen)
        if problem:
            return problem
    x = torch.randn(4, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    try:
        ok = torch.autograd.gradcheck(lambda a, b: cls.apply(a, b, 1.7), (x, w),
                                      raise_exception=False)
    except Exception as e:  # an error only gradcheck's inputs bring out
        err = f"{type(e).__name__}: {e}"
        return feedback(CHECKED, "torch.autograd.gradcheck passes", err, _error_fix(err))
    if not ok:
        return feedback(CHECKED, "torch.autograd.gradcheck passes (float64, scale=1.7)",
                        "a backward that disagrees with the finite differences",
                        "d(scale * x * w)/dx = scale * w and d(scale * x * w)/dw = scale * x; "
                        "each times grad_y (the chain rule)")
    return None
