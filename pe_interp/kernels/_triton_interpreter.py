"""Triton's interpreter, set up before any kernel is decorated (:mod:`pe_interp.kernels._triton_flash`
imports this first): a clear error when ``TRITON_INTERPRET`` came too late, and the index fix
for Triton 3.6 under NumPy >= 2.5."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["INTERPRET", "INTERPRETER_INDEX_FIX"]

INTERPRET: bool = bool(triton.knobs.runtime.interpret)

# Triton decorates its own library functions (tl.zeros, tl.sum, tl.max...) when triton is first
# imported, so TRITON_INTERPRET must already be set then, not only before this module is imported:
# otherwise they stay compiled-mode JITFunctions and the interpreter fails inside the kernel with
# "Cannot call @triton.jit'd outside of the scope of a kernel" (seen with Triton 3.6 and 3.8).
# Importing transformers can import triton early (transformers.masking_utils -> torch._dynamo ->
# triton, with transformers 5.17 and torch 2.11), so fail here with the cause instead.
if INTERPRET and type(tl.zeros).__name__ == "JITFunction":
    raise RuntimeError(
        "TRITON_INTERPRET=1 was set after triton had been imported (e.g. by torch._dynamo via "
        "transformers), so Triton's library functions were built for the GPU and the interpreter "
        "cannot run the kernels: set TRITON_INTERPRET=1 in the environment, or before the first "
        "import of torch._dynamo / transformers / triton."
    )


def _interpreter_index_fix() -> bool:
    """Let the interpreter of Triton 3.6 use scalar tensors as ints under NumPy >= 2.5.

    The interpreter holds a scalar as a 1-element 1-D numpy array, and Triton 3.6 turns it into
    an int with ``int(array)`` (``tensor.__index__``), which NumPy 2.5 refuses ("only
    0-dimensional arrays can be converted to Python scalars"): every ``range(0, S, BLOCK)`` over
    a runtime bound then fails. Triton 3.8 squeezes the array first; this wraps the function
    that installs ``__index__`` for each launch so that 3.6 does the same. Nothing changes for a
    NumPy that still converts, nor on the GPU. Returns whether the fix was installed.
    """
    import numpy as np

    try:
        int(np.ones(1, dtype=np.int32))
        return False  # NumPy < 2.5: the interpreter's own conversion works
    except TypeError:
        pass
    from triton.runtime import interpreter

    orig = getattr(interpreter, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_pe_interp_index_fix", False):
        return False

    def patch_lang_tensor(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor._pe_interp_index_fix = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


INTERPRETER_INDEX_FIX: bool = _interpreter_index_fix() if INTERPRET else False
