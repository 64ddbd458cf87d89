"""Ahead-of-time compile of the attention kernels for an NVIDIA target, without a GPU.

Triton can lower a kernel all the way to a cubin for, e.g., sm_90 on a CPU-only machine (the
wheel bundles ptxas). That catches what the interpreter cannot: invalid GPU lowerings, shared
memory over the per-block limit, register spills. Used by the test-suite and as a CLI::

    python -m pe_interp.kernels.compile_check            # bf16, head dims 16/64/128, sm_90

Must run in a process where ``TRITON_INTERPRET`` is unset (kernels decorated for the GPU).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time

#: pointer args that carry the q/k/v dtype; every other upper-case arg is a pointer to the
#: listed dtype (default fp32).
_IO_PTRS = {"Q", "K", "V", "OUT", "DO", "DQ", "DK", "DVG", "X", "Y"}
_PTR_DTYPES = {"KV": "u8", "HEADS": "u8", "BUCKETS": "u8"}
_FLOATS = {"qk_scale", "sm_scale"}
_INTS_UPPER = {"S", "H", "D", "DQK", "DV"}  # upper-case scalar args (sizes), not pointers
_FLAGS = ("CAUSAL", "HAS_KV", "HAS_ROPE", "HAS_HEADS", "HAS_ALIBI", "HAS_REL")
SMEM_LIMIT = 232448  # bytes per block on sm_90 (227 KB)


def _signature(fn, dtype: str, consts: dict) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in _IO_PTRS:
            sig[name] = "*" + dtype
        elif name.isupper() and name not in _INTS_UPPER:
            sig[name] = "*" + _PTR_DTYPES.get(name, "fp32")
        elif name in _FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _ptxas_report(ptx: str, arch: int) -> tuple[int | None, int | None]:
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return None, None
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        suffix = "a" if arch >= 90 else ""
        res = subprocess.run(
            [ptxas, "-v", f"--gpu-name=sm_{arch}{suffix}", f.name, "-o", os.devnull],
            capture_output=True,
            text=True,
        )
    finally:
        os.unlink(f.name)
    regs = re.findall(r"Used (\d+) registers", res.stderr)
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    return (int(regs[0]) if regs else None), (int(spills[0]) if spills else None)


def compile_kernels(
    *,
    arch: int = 90,
    dtype: str = "bf16",
    head_dim: int = 64,
    flags: dict | None = None,
    kinds: tuple[str, ...] = ("fwd", "dkdv", "dq", "rotate"),
) -> list[dict]:
    """Compile the kernels with the block configs ``fused_attention`` would use on GPU.

    Returns one dict per kernel: name, seconds, shared (bytes), regs, spills (from ptxas).
    Raises whatever Triton raises if a kernel does not compile.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import _triton_flash as K
    from .launch import _next_pow2, gpu_config, rotate_block

    if K.INTERPRET:
        raise RuntimeError("compile_check needs TRITON_INTERPRET unset (kernels are interpreted)")
    flags = (
        dict.fromkeys(_FLAGS, True) if flags is None else {f: bool(flags.get(f)) for f in _FLAGS}
    )
    d = _next_pow2(head_dim)
    fp32 = dtype == "fp32"
    heavy = flags["HAS_ROPE"] or flags["HAS_REL"]
    target = GPUTarget("cuda", arch, 32)
    out = []
    for kind in kinds:
        if kind == "rotate":
            fn = K._rope_rotate
            consts = dict(HAS_HEADS=flags["HAS_HEADS"], BLOCK=rotate_block(d), D_P=d)
            opts = dict(num_warps=4)
        else:
            cfg = gpu_config(kind, d, d, fp32=fp32, heavy=heavy)
            opts = dict(num_warps=cfg.pop("num_warps"), num_stages=cfg.pop("num_stages"))
            fn = {"fwd": K._attn_fwd, "dkdv": K._attn_bwd_dkdv, "dq": K._attn_bwd_dq}[kind]
            consts = dict(
                flags,
                **cfg,
                DQK_P=d,
                DV_P=d,
                DOT_UPCAST=False,
                DOT_PREC="tf32x3" if fp32 else "tf32",
            )
            if kind != "fwd":  # backward runs on pre-rotated q/k (flash.BWD_PREROTATE)
                consts.update(HAS_ROPE=False, UNROTATE=flags["HAS_ROPE"])
            if kind == "dq":
                consts.update(BIAS_GRAD=flags["HAS_REL"], BIAS_ATOMIC=True)
        t0 = time.perf_counter()
        src = ASTSource(fn, _signature(fn, dtype, consts), constexprs=consts)
        compiled = triton.compile(src, target=target, options=opts)
        secs = time.perf_counter() - t0
        regs, spills = _ptxas_report(compiled.asm["ptx"], arch)
        out.append(
            dict(
                kernel=kind,
                dtype=dtype,
                head_dim=d,
                seconds=round(secs, 2),
                shared=compiled.metadata.shared,
                regs=regs,
                spills=spills,
                **opts,
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--head-dims", default="16,64,128")
    args = ap.parse_args(argv)
    bad = 0
    for hd in (int(x) for x in args.head_dims.split(",")):
        for row in compile_kernels(arch=args.arch, dtype=args.dtype, head_dim=hd):
            over = row["shared"] > SMEM_LIMIT
            bad += over
            print(row, "SHARED MEMORY OVER LIMIT" if over else "")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
