"""Triton kernels and launchers for bias-aware FlashAttention (parts 1-2 of the op; 3-5 live in
``attention.py``).

Score for head h, query i, key j (natural-log units):

    s(i, j) = q_i·k_j * scale + T[h, qb_i, kb_j] + col[b, h, j] (+ dense[b, h, i, j])

``col`` carries ``-lam[h] * log1p(exposure_j)`` and ``-inf`` for padded keys; it is built with plain
torch ops by the caller, so its gradient (``dcol = sum_i dS(i, j)``) flows on to lam and exposure.
Inside the kernels scores are kept in log2 units (times log2 e) so the softmax uses exp2.

The bucket table enters in one of two ways (``TABLE``):
  1. one-hot queries, for tables with QB <= ``ONEHOT_MAX_BUCKETS`` query buckets (KB is free: the
     model's tables are ~26 x 256). The launcher gathers a per-key embedding
     ``E[b, h, j, :] = T[h, :, kb_j]`` (O(N * QB) memory, like an extra K), split into bf16 terms
     laid side by side (hi, mid for 16-bit inputs: ~16 mantissa bits; hi, mid, lo, 0 for fp32: ~24),
     so the bias of a (query, key) tile is ONE tensor-core dot ``onehot(qb) @ E^T`` of exact 0/1
     values. dT uses the same one-hot: the dK/dV program of a key block accumulates
     ``G[j, a] = sum_i dS(i, j) [qb_i = a]`` in fp32 (dS split into bf16 terms again) and writes it;
     torch sums G over keys of equal kb in fp64 (sort + prefix sums): deterministic, fp32 or better.
  2. gather, when QB is larger: the bias is gathered per (i, j) and dT uses fp32 atomics (not
     bitwise reproducible across runs).

This module is imported lazily (on the first Triton launch) because ``TRITON_INTERPRET`` is read
when ``@triton.jit`` runs: tests set it first and then run the kernels on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

INTERPRET = bool(triton.knobs.runtime.interpret)
LOG2E = 1.4426950408889634
ONEHOT_MAX_BUCKETS = 32  # query buckets; above this the table bias is gathered and dT uses atomics
MAX_HEAD_DIM = 128

# ------------------------------------------------------------------------------------------------
# 1. kernels
# ------------------------------------------------------------------------------------------------


@triton.jit
def _mm(a, b, acc, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """acc + a @ b. The interpreter gets bf16 dots wrong (STACK.md §2), so it upcasts to fp32."""
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        acc = tl.dot(a, b, acc, input_precision=PREC)
    return acc


@triton.jit
def _onehot(eq):
    """bool -> exact 0/1 bf16 (via a select: the interpreter casts bool -> bf16 wrongly)."""
    return tl.where(eq, 1.0, 0.0).to(tl.bfloat16)


@triton.jit
def _split_bf16(x):
    """fp32 x -> bf16 (hi, mid, lo) with x ~= hi + mid + lo to ~24 bits (lo is dead code if unused)."""
    hi = x.to(tl.bfloat16)
    r = x - hi.to(tl.float32)
    mid = r.to(tl.bfloat16)
    lo = (r - mid.to(tl.float32)).to(tl.bfloat16)
    return hi, mid, lo


@triton.jit
def _split_mm(x, onehot, acc, SPLIT: tl.constexpr, UPCAST: tl.constexpr):
    """acc + x @ onehot for fp32 x: one bf16 tensor-core dot per term of x (2, or 3 if SPLIT == 4)."""
    hi, mid, lo = _split_bf16(x)
    acc = _mm(hi, onehot, acc, UPCAST, "ieee")
    acc = _mm(mid, onehot, acc, UPCAST, "ieee")
    if SPLIT >= 4:
        acc = _mm(lo, onehot, acc, UPCAST, "ieee")
    return acc


@triton.jit
def _attn_fwd(
    Q, K, V, Out, LSE, RES,  # LSE (B*H, N_Q) fp32, log2 units; RES: O's rounding residual, bf16 like Out
    TAB, EK, QBK, KBK, COL, DB,  # table*log2e (H, QB, KB); E (B, H, N_K, SPLIT*QB_PAD) bf16; ids; col*log2e; dense
    qk_scale,  # scale * log2e
    s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_om,
    s_eb, s_eh, s_en, s_cb, s_ch, s_db, s_dh, s_dm, s_dn,
    H, N_Q, N_K, QB, KB, N_BUCKET,  # N_BUCKET: next_pow2(N_K), autotune key only
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TABLE: tl.constexpr, QB_PAD: tl.constexpr, SPLIT: tl.constexpr,
    DENSE: tl.constexpr, RESID: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """One program per query block: online softmax over key blocks; writes O and the row LSE (and,
    if RESID, what rounding O to 16 bits lost, for backward's delta = rowsum(dO * O))."""
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and HEAD_DIM >= 16, "tl.dot tiles must be >= 16")
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    col_base = COL + b * s_cb + h * s_ch
    tab_base = TAB + h * QB * KB
    if TABLE != 0:
        qb = tl.load(QBK + b * N_Q + offs_m, mask=row_ok, other=-1)
    if TABLE == 1:
        offs_e = tl.arange(0, SPLIT * QB_PAD)  # column t*QB_PAD + a: bf16 term t of bucket a
        onehot_q = _onehot(qb[:, None] == (offs_e % QB_PAD)[None, :])  # (BLOCK_M, SPLIT*QB_PAD), loop-invariant
        e_base = EK + b * s_eb + h * s_eh
    if DENSE:
        db_base = DB + b * s_db + h * s_dh + offs_m[:, None] * s_dm

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < N_K
        k = tl.load(k_base + offs_n[:, None] * s_kn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        s = _mm(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), UPCAST, PREC) * qk_scale
        if TABLE == 1:
            e = tl.load(e_base + offs_n[:, None] * s_en + offs_e[None, :], mask=col_ok[:, None], other=0.0)
            s = _mm(onehot_q, tl.trans(e), s, UPCAST, "ieee")  # + T[h, qb_i, kb_j]
        if TABLE == 2:
            kb = tl.load(KBK + b * N_K + offs_n, mask=col_ok, other=-1)
            ok = ((qb >= 0) & (qb < QB))[:, None] & ((kb >= 0) & (kb < KB))[None, :]
            s += tl.load(tab_base + qb[:, None] * KB + kb[None, :], mask=ok, other=0.0)
        if DENSE:
            db = tl.load(db_base + offs_n[None, :] * s_dn, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            s += db.to(tl.float32) * 1.4426950408889634
        s += tl.load(col_base + offs_n, mask=col_ok, other=float("-inf"))[None, :]
        # online softmax; a row with no finite score so far keeps m = -inf and p = 0 (no NaN)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * s_vn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        acc = _mm(p.to(v.dtype), v, acc * alpha[:, None], UPCAST, PREC)
        m_i = m_new
    alive = l_i > 0.0
    l_safe = tl.where(alive, l_i, 1.0)
    out = acc / l_safe[:, None]  # all-masked rows: 0 / 1 = 0
    lse = tl.where(alive, m_i + tl.math.log2(l_safe), float("inf"))  # +inf makes p = 0 in backward
    tl.store(LSE + bh * N_Q + offs_m, lse, mask=row_ok)
    o_ptrs = Out + b * s_ob + h * s_oh + offs_m[:, None] * s_om + offs_d[None, :]
    o_low = out.to(Out.dtype.element_ty)
    tl.store(o_ptrs, o_low, mask=row_ok[:, None])
    if RESID:
        res = (out - o_low.to(tl.float32)).to(tl.bfloat16)
        tl.store(RES + b * s_ob + h * s_oh + offs_m[:, None] * s_om + offs_d[None, :], res, mask=row_ok[:, None])


@triton.jit
def _attn_bwd_delta(
    Out, RES, DO, DELTA, s_ob, s_oh, s_om, s_gb, s_gh, s_gm, H, N_Q,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, RESID: tl.constexpr,
):
    """delta[bh, i] = sum_d O * dO in fp32 (the softmax-Jacobian row term), O = Out (+ RES)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    o_offs = b * s_ob + h * s_oh + offs_m[:, None] * s_om + offs_d[None, :]
    o = tl.load(Out + o_offs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    if RESID:
        o += tl.load(RES + o_offs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + b * s_gb + h * s_gh + offs_m[:, None] * s_gm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    delta = tl.sum(o * do.to(tl.float32), 1)
    tl.store(DELTA + bh * N_Q + offs_m, delta, mask=row_ok)


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV, DCOL, DTAB,  # DK, DV (B, H, N_K, HEAD_DIM); DCOL (B*H, N_K); DTAB: G or dT
    TAB, EK, QBK, KBK, COL, DB,
    qk_scale, sm_scale,
    s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_gb, s_gh, s_gm,
    s_eb, s_eh, s_en, s_cb, s_ch, s_db, s_dh, s_dm, s_dn,
    H, N_Q, N_K, QB, KB, N_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TABLE: tl.constexpr, QB_PAD: tl.constexpr, SPLIT: tl.constexpr,
    DENSE: tl.constexpr, NEED_DCOL: tl.constexpr, NEED_DTAB: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """One program per key block, looping over query blocks: dV = P^T dO, dK = scale dS^T Q,
    dcol = sum_i dS and the table gradient (G rows for TABLE 1, atomics into dT for TABLE 2)."""
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and HEAD_DIM >= 16, "tl.dot tiles must be >= 16")
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < N_K
    k = tl.load(K + b * s_kb + h * s_kh + offs_n[:, None] * s_kn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    v = tl.load(V + b * s_vb + h * s_vh + offs_n[:, None] * s_vn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    col = tl.load(COL + b * s_cb + h * s_ch + offs_n, mask=col_ok, other=float("-inf"))
    q_base = Q + b * s_qb + h * s_qh
    do_base = DO + b * s_gb + h * s_gh
    tab_base = TAB + h * QB * KB
    if TABLE == 1:
        offs_e = tl.arange(0, SPLIT * QB_PAD)
        e = tl.load(  # this key block's E rows, loaded once: biasT = E @ onehot(qb)^T
            EK + b * s_eb + h * s_eh + offs_n[:, None] * s_en + offs_e[None, :], mask=col_ok[:, None], other=0.0
        )  # (BLOCK_N, SPLIT*QB_PAD)
        offs_a = tl.arange(0, QB_PAD)
        g = tl.zeros([BLOCK_N, QB_PAD], tl.float32)  # G[j, a] = sum_i dS(i, j) [qb_i = a]
    if TABLE == 2:
        kb = tl.load(KBK + b * N_K + offs_n, mask=col_ok, other=-1)
    if DENSE:
        db_base = DB + b * s_db + h * s_dh + offs_n[:, None] * s_dn

    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dcol = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, N_Q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < N_Q
        q = tl.load(q_base + offs_m[:, None] * s_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        do = tl.load(do_base + offs_m[:, None] * s_gm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        lse = tl.load(LSE + bh * N_Q + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + bh * N_Q + offs_m, mask=row_ok, other=0.0)
        sT = _mm(k, tl.trans(q), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), UPCAST, PREC) * qk_scale
        if TABLE != 0:
            qb = tl.load(QBK + b * N_Q + offs_m, mask=row_ok, other=-1)
        if TABLE == 1:
            onehot_qT = _onehot((offs_e % QB_PAD)[:, None] == qb[None, :])  # (SPLIT*QB_PAD, BLOCK_M)
            sT = _mm(e, onehot_qT, sT, UPCAST, "ieee")
        if TABLE == 2:
            ok = ((kb >= 0) & (kb < KB))[:, None] & ((qb >= 0) & (qb < QB))[None, :]
            sT += tl.load(tab_base + qb[None, :] * KB + kb[:, None], mask=ok, other=0.0)
        if DENSE:
            db = tl.load(db_base + offs_m[None, :] * s_dm, mask=col_ok[:, None] & row_ok[None, :], other=0.0)
            sT += db.to(tl.float32) * 1.4426950408889634
        sT += col[:, None]
        pT = tl.math.exp2(sT - lse[None, :])  # (BLOCK_N, BLOCK_M); 0 for masked keys and dead rows
        dv = _mm(pT.to(do.dtype), do, dv, UPCAST, PREC)
        dpT = _mm(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), UPCAST, PREC)
        dsT = pT * (dpT - delta[None, :])  # dL/ds in natural units, fp32
        dk = _mm(dsT.to(q.dtype), q, dk, UPCAST, PREC)
        if NEED_DCOL:
            dcol += tl.sum(dsT, 1)
        if NEED_DTAB and TABLE == 1:
            g = _split_mm(dsT, _onehot(qb[:, None] == offs_a[None, :]), g, SPLIT, UPCAST)
        if NEED_DTAB and TABLE == 2:
            tl.atomic_add(DTAB + h * QB * KB + qb[None, :] * KB + kb[:, None], dsT, mask=ok)
    out = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + bh * N_K * HEAD_DIM + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + bh * N_K * HEAD_DIM + out, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])
    if NEED_DCOL:
        tl.store(DCOL + bh * N_K + offs_n, dcol, mask=col_ok)
    if NEED_DTAB and TABLE == 1:
        g_ptrs = DTAB + (bh * N_K + offs_n[:, None]) * QB_PAD + offs_a[None, :]  # G (B, H, N_K, QB_PAD)
        tl.store(g_ptrs, g, mask=col_ok[:, None])


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ, DDB,  # DQ (B, H, N_Q, HEAD_DIM); DDB (B, H, N_Q, N_K)
    TAB, EK, QBK, KBK, COL, DB,
    qk_scale, sm_scale,
    s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_gb, s_gh, s_gm,
    s_eb, s_eh, s_en, s_cb, s_ch, s_db, s_dh, s_dm, s_dn,
    H, N_Q, N_K, QB, KB, N_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TABLE: tl.constexpr, QB_PAD: tl.constexpr, SPLIT: tl.constexpr,
    DENSE: tl.constexpr, NEED_DDB: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """One program per query block, looping over key blocks: dQ = scale dS K, and dS itself for a
    dense bias."""
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and HEAD_DIM >= 16, "tl.dot tiles must be >= 16")
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * s_gb + h * s_gh + offs_m[:, None] * s_gm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + bh * N_Q + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + bh * N_Q + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * s_kb + h * s_kh
    v_base = V + b * s_vb + h * s_vh
    col_base = COL + b * s_cb + h * s_ch
    tab_base = TAB + h * QB * KB
    if TABLE != 0:
        qb = tl.load(QBK + b * N_Q + offs_m, mask=row_ok, other=-1)
    if TABLE == 1:
        offs_e = tl.arange(0, SPLIT * QB_PAD)
        onehot_q = _onehot(qb[:, None] == (offs_e % QB_PAD)[None, :])  # (BLOCK_M, SPLIT*QB_PAD)
        e_base = EK + b * s_eb + h * s_eh
    if DENSE:
        db_base = DB + b * s_db + h * s_dh + offs_m[:, None] * s_dm
    if NEED_DDB:
        ddb_base = DDB + bh * N_Q * N_K + offs_m[:, None] * N_K

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < N_K
        k = tl.load(k_base + offs_n[:, None] * s_kn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * s_vn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        s = _mm(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), UPCAST, PREC) * qk_scale
        if TABLE == 1:
            e = tl.load(e_base + offs_n[:, None] * s_en + offs_e[None, :], mask=col_ok[:, None], other=0.0)
            s = _mm(onehot_q, tl.trans(e), s, UPCAST, "ieee")
        if TABLE == 2:
            kb = tl.load(KBK + b * N_K + offs_n, mask=col_ok, other=-1)
            ok = ((qb >= 0) & (qb < QB))[:, None] & ((kb >= 0) & (kb < KB))[None, :]
            s += tl.load(tab_base + qb[:, None] * KB + kb[None, :], mask=ok, other=0.0)
        if DENSE:
            db = tl.load(db_base + offs_n[None, :] * s_dn, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            s += db.to(tl.float32) * 1.4426950408889634
        s += tl.load(col_base + offs_n, mask=col_ok, other=float("-inf"))[None, :]
        p = tl.math.exp2(s - lse[:, None])
        dp = _mm(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), UPCAST, PREC)
        ds = p * (dp - delta[:, None])  # dL/ds in natural units, fp32
        dq = _mm(ds.to(k.dtype), k, dq, UPCAST, PREC)
        if NEED_DDB:
            tl.store(ddb_base + offs_n[None, :], ds.to(DDB.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
    out = DQ + bh * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ------------------------------------------------------------------------------------------------
# autotuning: short lists, tried once per (N bucket, head dim, bias mode, dtype)
# ------------------------------------------------------------------------------------------------

_KEY = ["N_BUCKET", "HEAD_DIM", "TABLE", "DENSE", "QB_PAD", "SPLIT"]


def _cfg(bm: int, bn: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)


if INTERPRET:
    # one small config: the interpreter is slow, and uneven tiles exercise the M/N bookkeeping
    _FWD, _DKDV, _DQ = [_cfg(32, 16, 4, 1)], [_cfg(16, 32, 4, 1)], [_cfg(32, 16, 4, 1)]
    _FWD32, _DKDV32, _DQ32 = _FWD, _DKDV, _DQ
else:
    # 16-bit inputs (the fast path; Hopper and Ampere). Register notes from sm_90 compiles (ptxas -v,
    # bf16, D=64, 32 query buckets): the 8-warp configs are spill-free with the one-hot bias operands
    _FWD = [
        _cfg(128, 64, 8, 3),  # spill-free with the bias operands live; D = 128 too
        _cfg(128, 64, 4, 3),  # FA2-style default for D <= 64 without a table
        _cfg(128, 128, 8, 3),  # wider key tiles amortise the per-block softmax bookkeeping
        _cfg(64, 64, 4, 4),  # more programs for short contexts / small B*H
    ]
    _DKDV = [  # BLOCK_N keys per program (owned), BLOCK_M queries per step
        _cfg(32, 128, 4, 3),  # Triton tutorial's choice: big owned key block, thin query steps
        _cfg(32, 128, 8, 3),  # same with room for the G accumulator next to dK, dV
        _cfg(64, 64, 4, 3),  # more programs for short contexts
    ]
    _DQ = [  # BLOCK_M queries per program (owned), BLOCK_N keys per step
        _cfg(128, 64, 8, 3),  # spill-free with the bias operands live
        _cfg(128, 32, 4, 3),  # tutorial's choice for the dQ pass
        _cfg(64, 64, 4, 3),
    ]
    # fp32 inputs (correctness path): tiles twice as wide in bytes, so smaller tiles, fewer stages to
    # stay inside Hopper's 227 KB of shared memory at D = 128
    _FWD32, _DKDV32, _DQ32 = [_cfg(64, 32, 8, 2)], [_cfg(32, 64, 8, 2)], [_cfg(64, 32, 8, 2)]


def _by_dtype(wide: list[triton.Config], narrow: list[triton.Config]) -> dict:
    """Autotune prune hook: the fp32 list for fp32 inputs, the 16-bit list otherwise."""

    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        return wide if named_args["Q"].element_size() == 4 else narrow

    return {"early_config_prune": prune}


_fwd = triton.autotune(_FWD + _FWD32, key=_KEY, prune_configs_by=_by_dtype(_FWD32, _FWD))(_attn_fwd)
# dT by atomics (TABLE 2) must start from zero for every benchmarked config
_dkdv = triton.autotune(
    _DKDV + _DKDV32, key=[*_KEY, "NEED_DCOL", "NEED_DTAB"], reset_to_zero=["DTAB"],
    prune_configs_by=_by_dtype(_DKDV32, _DKDV),
)(_attn_bwd_dkdv)
_dq = triton.autotune(_DQ + _DQ32, key=[*_KEY, "NEED_DDB"], prune_configs_by=_by_dtype(_DQ32, _DQ))(_attn_bwd_dq)

# ------------------------------------------------------------------------------------------------
# 2. launchers
# ------------------------------------------------------------------------------------------------


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(max(int(n), 1)))


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs: tf32 when PyTorch allows it for matmuls, else tf32x3 (~fp32 accuracy on tensor cores)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "tf32x3"
    return "tf32"


def _stride_last(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _pad_head(x: Tensor, d_pad: int) -> Tensor:
    d = x.shape[-1]
    return x if d == d_pad else F.pad(x, (0, d_pad - d))  # (B, H, N, d_pad)


def _bf16_terms(x: Tensor, split: int) -> Tensor:
    """fp32 (..., C) -> bf16 (..., split*C): [hi | mid] or [hi | mid | lo | 0], x ~= their sum."""
    hi = x.bfloat16()
    r = x - hi.float()
    mid = r.bfloat16()
    terms = [hi, mid]
    if split == 4:
        lo = (r - mid.float()).bfloat16()
        terms += [lo, torch.zeros_like(lo)]
    return torch.cat(terms, dim=-1)


def _sum_by_bucket(g: Tensor, ids: Tensor, n: int) -> Tensor:
    """out[c] = sum of the rows g[r] with ids[r] == c; g (R, C) fp32, ids (R,) in [0, n) -> (n, C) fp32.

    Deterministic (stable sort + fp64 prefix sums, no atomics) and independent of TF32 settings.
    """
    order = torch.argsort(ids, stable=True)
    csum = F.pad(g[order].double().cumsum(dim=0), (0, 0, 1, 0))  # (R + 1, C), row 0 = 0
    ends = torch.bincount(ids, minlength=n).cumsum(dim=0)  # (n,) one past each bucket's last row
    return torch.diff(csum[ends], dim=0, prepend=csum[:1]).float()


class _Plan:
    """Shapes, flags and prepared side inputs shared by forward and backward launches."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, table: Tensor | None, qb: Tensor | None,
                 kb: Tensor | None, col: Tensor, dense: Tensor | None, scale: float | None):
        if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
            raise ValueError(
                f"expected q (B, H, Nq, D) and k, v (B, H, Nk, D); got q {tuple(q.shape)}, "
                f"k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
            raise TypeError(
                f"q, k, v must share one dtype among float16/bfloat16/float32; got {q.dtype}, {k.dtype}, {v.dtype}"
            )
        if not (q.device == k.device == v.device):
            raise ValueError(f"q, k, v on different devices: {q.device}, {k.device}, {v.device}")
        self.B, self.H, self.NQ, self.D = q.shape
        self.NK = k.shape[2]
        if self.D > MAX_HEAD_DIM:
            raise ValueError(
                f"head dim {self.D} > {MAX_HEAD_DIM} is not supported by the Triton kernel; "
                "use backend='sdpa' or 'reference', or split heads"
            )
        self.d_pad = _pow2(self.D)
        self.scale = self.D**-0.5 if scale is None else float(scale)
        self.dtype = q.dtype
        self.device = q.device
        self.split = 4 if self.dtype == torch.float32 else 2
        self.dummy_f = torch.zeros(1, device=self.device)

        if col.shape[0] != self.B or col.shape[2] != self.NK or col.shape[1] not in (1, self.H):
            raise ValueError(f"col must be (B, H or 1, Nk) = ({self.B}, {self.H}, {self.NK}); got {tuple(col.shape)}")
        self.col2 = (col.float() * LOG2E).contiguous()  # (B, H|1, Nk), log2 units
        self.col_strides = (self.col2.stride(0), self.col2.stride(1) if self.col2.shape[1] == self.H else 0)

        self.table_mode, self.QB, self.KB = 0, 1, 1
        dummy_i = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.tab2, self.ekey, self.qb, self.kb = self.dummy_f, self.dummy_f, dummy_i, dummy_i
        self.e_strides = (0, 0, 0)
        if table is not None:
            self._prepare_table(table, qb, kb)
        self.qb_pad = _pow2(self.QB)
        if self.table_mode == 1:
            # E[b, h, j, :] = T[h, :, kb_j] * log2e as bf16 terms side by side; a (B, H, Nk, SPLIT*QB_PAD) view
            t = F.pad(self.tab2.transpose(1, 2), (0, self.qb_pad - self.QB))  # (H, KB, QB_PAD)
            self.ekey = _bf16_terms(t, self.split)[:, self.kb_long].transpose(0, 1)  # (B, H, Nk, SPLIT*QB_PAD)
            self.e_strides = tuple(self.ekey.stride()[:3])

        self.dense = None
        self.dense_strides = (0, 0, 0, 0)
        if dense is not None:
            if not dense.is_floating_point():
                raise TypeError(f"dense bias must be floating point; got {dense.dtype}")
            try:
                self.dense = dense.detach().expand(self.B, self.H, self.NQ, self.NK)  # stride 0 on broadcast dims
            except RuntimeError as e:
                raise ValueError(
                    f"dense bias {tuple(dense.shape)} does not broadcast to (B, H, Nq, Nk) = "
                    f"({self.B}, {self.H}, {self.NQ}, {self.NK})"
                ) from e
            self.dense_strides = tuple(self.dense.stride())

    def _prepare_table(self, table: Tensor, qb: Tensor | None, kb: Tensor | None) -> None:
        if qb is None or kb is None:
            raise ValueError("a bias table needs qb (B, Nq) and kb (B, Nk) bucket ids; got None")
        if table.dim() != 3 or table.shape[0] != self.H:
            raise ValueError(f"table must be (H={self.H}, QB, KB); got {tuple(table.shape)}")
        if qb.shape != (self.B, self.NQ) or kb.shape != (self.B, self.NK):
            raise ValueError(
                f"qb must be (B, Nq) = ({self.B}, {self.NQ}) and kb (B, Nk) = ({self.B}, {self.NK}); "
                f"got {tuple(qb.shape)} and {tuple(kb.shape)}"
            )
        self.QB, self.KB = table.shape[1], table.shape[2]
        self.table_mode = 1 if self.QB <= ONEHOT_MAX_BUCKETS else 2
        self.tab2 = (table.detach().float() * LOG2E).contiguous()  # (H, QB, KB), log2 units
        for name, ids, n in (("qb", qb, self.QB), ("kb", kb, self.KB)):
            if ids.numel():  # device-side check: no host sync on CUDA
                torch._assert_async((ids.min() >= 0) & (ids.max() < n), f"{name} bucket ids must lie in [0, {n})")
        self.qb = qb.to(torch.int32).contiguous()  # (B, Nq)
        self.kb = kb.to(torch.int32).contiguous()  # (B, Nk)
        self.kb_long = kb.long()  # (B, Nk)

    def consts(self) -> dict:
        return {
            "HEAD_DIM": self.d_pad, "TABLE": self.table_mode, "QB_PAD": self.qb_pad, "SPLIT": self.split,
            "DENSE": self.dense is not None, "UPCAST": INTERPRET, "PREC": _dot_precision(self.dtype),
        }

    def side_args(self) -> tuple:
        dense = self.dense if self.dense is not None else self.dummy_f
        return (self.tab2, self.ekey, self.qb, self.kb, self.col2, dense)

    def side_strides(self) -> tuple:
        return (*self.e_strides, *self.col_strides, *self.dense_strides)

    def sizes(self) -> tuple:
        return (self.H, self.NQ, self.NK, self.QB, self.KB, _pow2(self.NK))

    def table_grad(self, dtab: Tensor) -> Tensor:
        """(H, QB, KB) fp32 table gradient from the kernel's G (TABLE 1) or atomic dT (TABLE 2)."""
        if self.table_mode == 2:
            return dtab
        g = dtab.view(self.B, self.H, self.NK, self.qb_pad).transpose(1, 2)  # (B, Nk, H, QB_PAD)
        per_kb = _sum_by_bucket(g.reshape(self.B * self.NK, -1), self.kb_long.reshape(-1), self.KB)
        return per_kb.view(self.KB, self.H, self.qb_pad).permute(1, 2, 0)[:, : self.QB]  # (H, QB, KB)


def _check_device(x: Tensor) -> None:
    if x.device.type != "cuda" and not INTERPRET:
        raise RuntimeError(
            f"the Triton attention kernel needs CUDA tensors; got {x.device}. Use backend='sdpa' or 'reference' "
            "on CPU, or set TRITON_INTERPRET=1 before the first Triton launch to run the (slow) interpreter"
        )


def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, table: Tensor | None, qb: Tensor | None, kb: Tensor | None,
    col: Tensor, dense: Tensor | None, scale: float | None, residual: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Fused forward. Shapes: q (B, H, Nq, D), k/v (B, H, Nk, D), table (H, QB, KB), qb (B, Nq),
    kb (B, Nk), col (B, H|1, Nk) natural-log units (-inf = masked key), dense broadcastable to
    (B, H, Nq, Nk). Returns o (B, H, Nq, D) in q's dtype, lse (B*H, Nq) fp32 in log2 units (+inf for
    rows with no unmasked key) and, if ``residual`` and o is 16-bit, o's rounding residual
    (B, H, Nq, D_pad) bf16. With it backward's delta = rowsum(dO * O) sees o before its final 16-bit
    rounding, which about halves the error of dT and dlam (sums of terms that cancel row by row);
    what remains comes from P being rounded to 16 bits for P @ V, as in FlashAttention."""
    _check_device(q)
    plan = _Plan(q, k, v, table, qb, kb, col, dense, scale)
    B, H, NQ, D = plan.B, plan.H, plan.NQ, plan.D
    qp, kp, vp = (_stride_last(_pad_head(x, plan.d_pad)) for x in (q, k, v))  # (B, H, N, d_pad)
    o = torch.empty(B, H, NQ, plan.d_pad, device=q.device, dtype=q.dtype)
    lse = torch.empty(B * H, NQ, device=q.device, dtype=torch.float32)
    residual = residual and q.dtype != torch.float32
    res = torch.zeros_like(o, dtype=torch.bfloat16) if residual else None
    if NQ and plan.NK:

        def grid(meta: dict) -> tuple[int, int]:
            return (triton.cdiv(NQ, meta["BLOCK_M"]), B * H)

        _fwd[grid](
            qp, kp, vp, o, lse, res if residual else plan.dummy_f, *plan.side_args(), plan.scale * LOG2E,
            *qp.stride()[:3], *kp.stride()[:3], *vp.stride()[:3], *o.stride()[:3], *plan.side_strides(),
            *plan.sizes(), **plan.consts(), RESID=residual,
        )
    else:  # no keys at all: every row is all-masked
        o.zero_()
        lse.fill_(float("inf"))
    return o[..., :D], lse, res


def attention_backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, res: Tensor | None, table: Tensor | None,
    qb: Tensor | None, kb: Tensor | None, col: Tensor, dense: Tensor | None, scale: float | None,
    need_dtable: bool, need_dcol: bool, need_ddense: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Fused backward (``o``, ``lse``, ``res`` from :func:`attention_forward`). Returns dq, dk, dv like
    q, k, v; dtable (H, QB, KB) fp32; dcol (B, H, Nk) fp32 (= sum_i dS); ddense (B, H, Nq, Nk) in
    dense's dtype (not yet summed over broadcast dims)."""
    _check_device(q)
    plan = _Plan(q, k, v, table, qb, kb, col, dense, scale)
    B, H, NQ, NK, D, dp_ = plan.B, plan.H, plan.NQ, plan.NK, plan.D, plan.d_pad
    qp, kp, vp, op, dop = (_stride_last(_pad_head(x, dp_)) for x in (q, k, v, o, do))  # (B, H, N, d_pad)
    dq = torch.empty(B, H, NQ, dp_, device=q.device, dtype=q.dtype)
    dk = torch.empty(B, H, NK, dp_, device=q.device, dtype=q.dtype)
    dv = torch.empty(B, H, NK, dp_, device=q.device, dtype=q.dtype)
    need_dtable = need_dtable and plan.table_mode != 0
    need_ddense = need_ddense and plan.dense is not None
    dcol = torch.empty(B * H, NK, device=q.device, dtype=torch.float32) if need_dcol else plan.dummy_f
    ddense = torch.empty(B, H, NQ, NK, device=q.device, dtype=dense.dtype) if need_ddense else plan.dummy_f
    if need_dtable and plan.table_mode == 1:  # G (B, H, Nk, QB_PAD), every row written by its key block
        dtab = torch.empty(B * H * NK * plan.qb_pad, device=q.device, dtype=torch.float32)
    elif need_dtable:  # atomics accumulate into dT
        dtab = torch.zeros(H, plan.QB, plan.KB, device=q.device, dtype=torch.float32)
    else:
        dtab = plan.dummy_f
    if NQ == 0 or NK == 0:
        for g in (dq, dk, dv, dcol, ddense, dtab):
            g.zero_()
    else:
        delta = torch.empty(B * H, NQ, device=q.device, dtype=torch.float32)
        bm = 16 if INTERPRET else 64
        if res is not None and res.stride() != op.stride():
            raise ValueError(f"residual strides {res.stride()} differ from o's {op.stride()}; pass attention_forward's")
        _attn_bwd_delta[(triton.cdiv(NQ, bm), B * H)](
            op, res if res is not None else plan.dummy_f, dop, delta, *op.stride()[:3], *dop.stride()[:3], H, NQ,
            HEAD_DIM=dp_, BLOCK_M=bm, RESID=res is not None,
        )
        common = (
            *plan.side_args(), plan.scale * LOG2E, plan.scale,
            *qp.stride()[:3], *kp.stride()[:3], *vp.stride()[:3], *dop.stride()[:3], *plan.side_strides(),
            *plan.sizes(),
        )

        def grid_n(meta: dict) -> tuple[int, int]:
            return (triton.cdiv(NK, meta["BLOCK_N"]), B * H)

        def grid_m(meta: dict) -> tuple[int, int]:
            return (triton.cdiv(NQ, meta["BLOCK_M"]), B * H)

        _dkdv[grid_n](
            qp, kp, vp, dop, lse, delta, dk, dv, dcol, dtab, *common, **plan.consts(),
            NEED_DCOL=need_dcol, NEED_DTAB=need_dtable,
        )
        _dq[grid_m](qp, kp, vp, dop, lse, delta, dq, ddense, *common, **plan.consts(), NEED_DDB=need_ddense)
    dtable = plan.table_grad(dtab) if need_dtable else None
    dcol_out = dcol.view(B, H, NK) if need_dcol else None
    ddense_out = ddense if need_ddense else None
    return dq[..., :D], dk[..., :D], dv[..., :D], dtable, dcol_out, ddense_out


__all__ = ["INTERPRET", "ONEHOT_MAX_BUCKETS", "attention_backward", "attention_forward"]
