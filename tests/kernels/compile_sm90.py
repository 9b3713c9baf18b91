"""Compile each attention kernel for sm_90 (Hopper) without a GPU; run by test_compile_hopper.py.

Exit 0 when every variant compiles and fits in shared memory, 1 on a compile error, 3 when the
toolchain is missing (the test then skips). Usage: python tests/kernels/compile_sm90.py [--all]
(--all: every autotune config; default: the first config of each kernel).
"""

from __future__ import annotations

import os
import sys

assert not os.environ.get("TRITON_INTERPRET"), "run without TRITON_INTERPRET: this compiles the real kernels"

import triton  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as e:  # pragma: no cover - triton layout changed
    print(f"triton compiler API not found: {e}")
    sys.exit(3)

import hir_kernels.attention_triton as at  # noqa: E402

HOPPER_SMEM = 232448  # bytes of dynamic shared memory per block on sm_90


def signature(fn, dtype: str, consts: dict) -> dict:
    ptr = {n: "*" + dtype for n in ("Q", "K", "V", "Out", "DO", "DQ", "DK", "DV")}
    ptr.update({n: "*fp32" for n in ("LSE", "DELTA", "DCOL", "TAB", "COL", "DTAB")})
    ptr.update({"EK": "*bf16", "RES": "*bf16", "QID": "*i32", "KID": "*i32", "qk_scale": "fp32", "sm_scale": "fp32"})
    ptr.update({n: ("i32",) * (2 if n == "st_c" else 3) for n in fn.arg_names if n.startswith("st_")})  # stride tuples
    return {n: "constexpr" if n in consts else ptr.get(n, "i32") for n in fn.arg_names}


def compile_one(kernel, dtype: str, consts: dict, cfg: triton.Config) -> int:
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel  # the JITFunction
    consts = {**consts, **cfg.kwargs}
    src = ASTSource(
        fn=fn, signature=signature(fn, dtype, consts),
        constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
    )
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).metadata.shared


def main() -> int:
    every = "--all" in sys.argv
    variants = [  # (dtype, head dim, table mode, number of tables, configs)
        ("bf16", 64, 1, 1, (at._FWD, at._DKDV, at._DQ)),
        ("fp16", 32, 2, 2, (at._FWD, at._DKDV, at._DQ)),
        ("fp32", 128, 1, 2, (at._FWD32, at._DKDV32, at._DQ32)),
        ("bf16", 64, 0, 1, (at._FWD, at._DKDV, at._DQ)),
    ]
    bad = 0
    for dtype, d, table, n_tables, (fwd_cfgs, dkdv_cfgs, dq_cfgs) in variants:
        base = {
            "HEAD_DIM": d, "TABLE": table, "N_TABLES": n_tables, "QB_PAD": 32, "SPLIT": 4 if dtype == "fp32" else 2,
            "UPCAST": False, "PREC": "tf32x3" if dtype == "fp32" else "tf32",
        }
        jobs = [
            ("fwd", at._fwd, fwd_cfgs, {"RESID": dtype != "fp32"}),
            ("dkdv", at._dkdv, dkdv_cfgs, {"NEED_DCOL": True, "NEED_DTAB": table != 0}),
            ("dq", at._dq, dq_cfgs, {}),
        ]
        for name, kernel, cfgs, extra in jobs:
            for cfg in cfgs if every else cfgs[:1]:
                label = f"{name} {dtype} D={d} table={table} tables={n_tables} {cfg}"
                try:
                    smem = compile_one(kernel, dtype, {**base, **extra}, cfg)
                except Exception as e:  # report every failure, not just the first
                    if "ptxas" in str(e) and "not found" in str(e):
                        print(f"no ptxas for sm_90: {e}")
                        return 3
                    print(f"FAILED {label}: {type(e).__name__}: {str(e)[:1500]}")
                    bad += 1
                    continue
                fits = smem <= HOPPER_SMEM
                bad += not fits
                print(f"{'ok' if fits else 'TOO MUCH SMEM'} {label} smem={smem}")
    try:
        delta = at.triton.Config({}, num_warps=4, num_stages=1)
        compile_one(at._attn_bwd_delta, "bf16", {"HEAD_DIM": 64, "BLOCK_M": 64, "RESID": True}, delta)
        print("ok delta bf16 D=64")
    except Exception as e:
        print(f"FAILED delta: {type(e).__name__}: {str(e)[:1500]}")
        bad += 1
    print(f"compiled with {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
