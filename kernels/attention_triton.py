"""Fused bias-aware FlashAttention in Triton: the kernels (1), launchers (2), autograd.Function (3) and
public function (4) of the op; its pure-PyTorch reference (5) is ``hir_kernels.attention_reference``
and its FlexAttention form is ``hir_kernels.Bias.score_mod``.

Score for head h, query i, key j (natural-log units; see ``bias.py``):

    s(i, j) = q_i·k_j * scale  +  sum_t T_t[h, qb_t(i), kb_t(j)]  +  col[b, h, j]

``col`` is the sum of the bias's column parts with ``-inf`` on masked keys, built with torch ops by
the caller, so its gradient (``dcol = sum_i dS(i, j)``) flows on by autograd (to lam and exposure for
the exposure term). Every kernel computes a score tile with one helper, :func:`_score`, so a change
to the score is made once. Inside the kernels scores are kept in log2 units (times log2 e) so the
softmax uses exp2. Rows with no unmasked key give O = 0 and zero gradients; only the per-row
log-sum-exp is kept for backward: O(N) memory.

The tables enter in one of two ways (``TABLE``):
  1. one-hot queries, when the tables have QB = sum_t QB_t <= ``ONEHOT_MAX_BUCKETS`` query buckets
     in all (KB is free: the model's table is ~26 x 216). The tables' query buckets are laid side by
     side (table t in columns [off_t, off_t + QB_t)), and the launcher gathers a per-key embedding
     ``E[b, h, j, off_t + a] = T_t[h, a, kb_t(j)]`` (O(N * QB) memory, like an extra K), split into
     bf16 terms laid side by side (hi, mid for 16-bit inputs: ~16 mantissa bits; hi, mid, lo, 0 for
     fp32: ~24), so the bias of a (query, key) tile is ONE tensor-core dot ``hot(q) @ E^T`` of exact
     0/1 values, ``hot`` having a one in the column of each table's query bucket. dT uses the same
     multi-hot: the dK/dV program of a key block accumulates ``G[j, c] = sum_i dS(i, j) hot(i, c)``
     in fp32 (dS split into bf16 terms again) and writes it; torch sums each table's columns of G
     over keys of equal kb_t in fp64 (sort + prefix sums): deterministic, fp32 or better.
  2. gather, when QB is larger: the tables are flattened side by side and each is gathered per
     (i, j); dT uses fp32 atomics (not bitwise reproducible across runs).

``TRITON_INTERPRET`` is read when ``@triton.jit`` runs, so this module is imported lazily (on the
first Triton launch, ``hir_kernels.dispatch``): tests set it first and then run the kernels on CPU.
The interpreter gets bf16 dots wrong (STACK.md §2), so there every dot runs in fp32 (``UPCAST``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from hir_kernels.bias import Bias

INTERPRET = bool(triton.knobs.runtime.interpret)
LOG2E = 1.4426950408889634
ONEHOT_MAX_BUCKETS = 32  # query buckets of all tables; above this the tables are gathered and dT uses atomics
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
def _hit(qid, cols, KEY_MAJOR: tl.constexpr):
    """[cols == qid]: (len(qid), len(cols)), or (len(cols), len(qid)) if KEY_MAJOR."""
    if KEY_MAJOR:
        hit = cols[:, None] == qid[None, :]
    else:
        hit = qid[:, None] == cols[None, :]
    return hit


@triton.jit
def _query_hot(QID, b, B, N_Q, offs_m, row_ok, cols, N_TABLES: tl.constexpr, KEY_MAJOR: tl.constexpr):
    """bf16 0/1 ``hot[i, c] = [cols[c] == qid_t(i) for some table t]`` of a query block, QID holding
    each table's query bucket plus its column offset (N_TABLES, B, N_Q); (BLOCK_M, C), or
    (C, BLOCK_M) if KEY_MAJOR. Padded rows (qid -1) are all zero."""
    hit = _hit(tl.load(QID + b * N_Q + offs_m, mask=row_ok, other=-1), cols, KEY_MAJOR)
    for t in tl.static_range(1, N_TABLES):
        hit = hit | _hit(tl.load(QID + (t * B + b) * N_Q + offs_m, mask=row_ok, other=-1), cols, KEY_MAJOR)
    return _onehot(hit)


@triton.jit
def _table_ptrs(TAB, QID, KID, t, b, B, N_Q, N_K, offs_m, offs_n, row_ok, col_ok, KEY_MAJOR: tl.constexpr):
    """Pointers to ``T_t[h, qb_t(i), kb_t(j)]`` in the flat tables at head h (TAB), QID holding each
    table's row start ``off_t + qb_t * KB_t`` and KID ``kb_t``, and their mask: (BLOCK_M, BLOCK_N),
    or (BLOCK_N, BLOCK_M) if KEY_MAJOR."""
    qid = tl.load(QID + (t * B + b) * N_Q + offs_m, mask=row_ok, other=0)
    kid = tl.load(KID + (t * B + b) * N_K + offs_n, mask=col_ok, other=0)
    if KEY_MAJOR:
        ptrs = TAB + kid[:, None] + qid[None, :]
        ok = col_ok[:, None] & row_ok[None, :]
    else:
        ptrs = TAB + qid[:, None] + kid[None, :]
        ok = row_ok[:, None] & col_ok[None, :]
    return ptrs, ok


@triton.jit
def _score(
    x_r, x_cT, hot_r, hot_cT, col, qk_scale, TAB, QID, KID, b, B, N_Q, N_K, offs_m, offs_n, row_ok, col_ok,
    TABLE: tl.constexpr, N_TABLES: tl.constexpr, KEY_MAJOR: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """The score tile in log2 units, the one place the kernels compute it. Rows are queries
    (x_r = q, x_cT = k^T, hot_r = hot(q), hot_cT = E^T) or, if KEY_MAJOR, keys (x_r = k, x_cT = q^T,
    hot_r = E, hot_cT = hot(q)^T); col is this key block's column vector:

        q·k * scale  +  sum_t T_t[h, qb_t, kb_t]  +  col
        (one dot)       (TABLE 1: one multi-hot dot;   (broadcast over queries)
                         TABLE 2: one gather per table)
    """
    s = _mm(x_r, x_cT, tl.zeros((x_r.shape[0], x_cT.shape[1]), tl.float32), UPCAST, PREC) * qk_scale
    if TABLE == 1:
        s = _mm(hot_r, hot_cT, s, UPCAST, "ieee")
    if TABLE == 2:
        for t in tl.static_range(N_TABLES):
            ptrs, ok = _table_ptrs(TAB, QID, KID, t, b, B, N_Q, N_K, offs_m, offs_n, row_ok, col_ok, KEY_MAJOR)
            s += tl.load(ptrs, mask=ok, other=0.0)
    if KEY_MAJOR:
        s += col[:, None]
    else:
        s += col[None, :]
    return s


@triton.jit
def _program(H):
    """This program's block index along axis 0, and its (b * H + h, b, h) along axis 1."""
    bh = tl.program_id(1).to(tl.int64)
    return tl.program_id(0), bh, bh // H, bh % H


@triton.jit
def _tile(X, st, b, h, rows, ok, cols):
    """``X[b, h, rows, cols]`` of a (B, H, N, C) tensor with (batch, head, row) strides ``st`` and last
    stride 1; 0 where not ``ok`` (rows past N)."""
    return tl.load(X + b * st[0] + h * st[1] + rows[:, None] * st[2] + cols[None, :], mask=ok[:, None], other=0.0)


@triton.jit
def _query_block(
    Q, st_q, QID, b, h, B, N_Q, start, offs_d, cols,
    BLOCK_M: tl.constexpr, TABLE: tl.constexpr, N_TABLES: tl.constexpr, KEY_MAJOR: tl.constexpr,
):
    """Queries [start, start + BLOCK_M) of (b, h): offs_m, row_ok, q (BLOCK_M, HEAD_DIM) and their
    table multi-hot over ``cols`` (:func:`_query_hot`; q itself, a dead placeholder, unless TABLE == 1)."""
    offs_m = start + tl.arange(0, BLOCK_M)
    row_ok = offs_m < N_Q
    q = _tile(Q, st_q, b, h, offs_m, row_ok, offs_d)
    hot = q
    if TABLE == 1:
        hot = _query_hot(QID, b, B, N_Q, offs_m, row_ok, cols, N_TABLES, KEY_MAJOR)
    return offs_m, row_ok, q, hot


@triton.jit
def _key_block(
    K, st_k, EK, st_e, COL, st_c, b, h, N_K, start, offs_d, offs_e, BLOCK_N: tl.constexpr, TABLE: tl.constexpr,
):
    """Keys [start, start + BLOCK_N) of (b, h): offs_n, col_ok, k (BLOCK_N, HEAD_DIM), their table rows
    E (BLOCK_N, SPLIT*QB_PAD; k itself, a dead placeholder, unless TABLE == 1) and their column
    vector (BLOCK_N,) in log2 units, -inf past N_K."""
    offs_n = start + tl.arange(0, BLOCK_N)
    col_ok = offs_n < N_K
    k = _tile(K, st_k, b, h, offs_n, col_ok, offs_d)
    e = k
    if TABLE == 1:
        e = _tile(EK, st_e, b, h, offs_n, col_ok, offs_e)
    col = tl.load(COL + b * st_c[0] + h * st_c[1] + offs_n, mask=col_ok, other=float("-inf"))
    return offs_n, col_ok, k, e, col


@triton.jit
def _row_grads(DO, st_g, LSE, DELTA, bh, b, h, offs_m, row_ok, offs_d, N_Q):
    """dO (BLOCK_M, HEAD_DIM), the row LSE (+inf past N_Q: p = 0 there) and delta of a query block."""
    do = _tile(DO, st_g, b, h, offs_m, row_ok, offs_d)
    lse = tl.load(LSE + bh * N_Q + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + bh * N_Q + offs_m, mask=row_ok, other=0.0)
    return do, lse, delta


@triton.jit
def _attn_fwd(
    Q, K, V, Out, LSE, RES,  # LSE (B*H, N_Q) fp32, log2 units; RES: O's rounding residual, bf16 like Out
    TAB, EK, QID, KID, COL, qk_scale,  # tables, E, ids, col: see the launcher (_Plan); qk_scale = scale * log2e
    st_q, st_k, st_v, st_o, st_e, st_c,  # (batch, head, row) strides of q, k, v, Out and RES, E; (batch, head) of col
    B, H, N_Q, N_K, TAB_H, N_BUCKET,  # N_BUCKET: next_pow2(N_K), autotune key only
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TABLE: tl.constexpr, N_TABLES: tl.constexpr, QB_PAD: tl.constexpr, SPLIT: tl.constexpr,
    RESID: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """One program per query block: online softmax over key blocks; writes O and the row LSE (and,
    if RESID, what rounding O to 16 bits lost, for backward's delta = rowsum(dO * O))."""
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and HEAD_DIM >= 16, "tl.dot tiles must be >= 16")
    pid_m, bh, b, h = _program(H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_e = tl.arange(0, SPLIT * QB_PAD)  # column t*QB_PAD + c: bf16 term t of query bucket c
    offs_m, row_ok, q, hot = _query_block(  # hot: (BLOCK_M, SPLIT*QB_PAD), loop-invariant
        Q, st_q, QID, b, h, B, N_Q, pid_m * BLOCK_M, offs_d, offs_e % QB_PAD, BLOCK_M, TABLE, N_TABLES, False
    )
    tab = TAB + h * TAB_H

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n, col_ok, k, e, col = _key_block(K, st_k, EK, st_e, COL, st_c, b, h, N_K, start_n, offs_d, offs_e, BLOCK_N, TABLE)
        s = _score(q, tl.trans(k), hot, tl.trans(e), col, qk_scale, tab, QID, KID, b, B, N_Q, N_K,
                   offs_m, offs_n, row_ok, col_ok, TABLE, N_TABLES, False, UPCAST, PREC)
        # online softmax; a row with no finite score so far keeps m = -inf and p = 0 (no NaN)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _tile(V, st_v, b, h, offs_n, col_ok, offs_d)
        acc = _mm(p.to(v.dtype), v, acc * alpha[:, None], UPCAST, PREC)
        m_i = m_new
    alive = l_i > 0.0
    l_safe = tl.where(alive, l_i, 1.0)
    out = acc / l_safe[:, None]  # all-masked rows: 0 / 1 = 0
    lse = tl.where(alive, m_i + tl.math.log2(l_safe), float("inf"))  # +inf makes p = 0 in backward
    tl.store(LSE + bh * N_Q + offs_m, lse, mask=row_ok)
    o_offs = b * st_o[0] + h * st_o[1] + offs_m[:, None] * st_o[2] + offs_d[None, :]
    o_low = out.to(Out.dtype.element_ty)
    tl.store(Out + o_offs, o_low, mask=row_ok[:, None])
    if RESID:
        tl.store(RES + o_offs, (out - o_low.to(tl.float32)).to(tl.bfloat16), mask=row_ok[:, None])


@triton.jit
def _attn_bwd_delta(
    Out, RES, DO, DELTA, st_o, st_g, H, N_Q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, RESID: tl.constexpr,
):
    """delta[bh, i] = sum_d O * dO in fp32 (the softmax-Jacobian row term), O = Out (+ RES)."""
    pid_m, bh, b, h = _program(H)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    o = _tile(Out, st_o, b, h, offs_m, row_ok, offs_d).to(tl.float32)
    if RESID:
        o += _tile(RES, st_o, b, h, offs_m, row_ok, offs_d).to(tl.float32)
    delta = tl.sum(o * _tile(DO, st_g, b, h, offs_m, row_ok, offs_d).to(tl.float32), 1)
    tl.store(DELTA + bh * N_Q + offs_m, delta, mask=row_ok)


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV, DCOL, DTAB,  # DK, DV (B, H, N_K, HEAD_DIM); DCOL (B*H, N_K); DTAB: G or flat dT
    TAB, EK, QID, KID, COL, qk_scale, sm_scale,
    st_q, st_k, st_v, st_g, st_e, st_c,  # st_g: dO's
    B, H, N_Q, N_K, TAB_H, N_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TABLE: tl.constexpr, N_TABLES: tl.constexpr, QB_PAD: tl.constexpr, SPLIT: tl.constexpr,
    NEED_DCOL: tl.constexpr, NEED_DTAB: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """One program per key block, looping over query blocks: dV = P^T dO, dK = scale dS^T Q,
    dcol = sum_i dS and the tables' gradient (G rows for TABLE 1, atomics into dT for TABLE 2)."""
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and HEAD_DIM >= 16, "tl.dot tiles must be >= 16")
    pid_n, bh, b, h = _program(H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_e = tl.arange(0, SPLIT * QB_PAD)
    offs_c = tl.arange(0, QB_PAD)
    offs_n, col_ok, k, e, col = _key_block(  # loaded once: biasT = E @ hot(q)^T
        K, st_k, EK, st_e, COL, st_c, b, h, N_K, pid_n * BLOCK_N, offs_d, offs_e, BLOCK_N, TABLE
    )
    v = _tile(V, st_v, b, h, offs_n, col_ok, offs_d)
    tab = TAB + h * TAB_H
    if TABLE == 1:
        g = tl.zeros([BLOCK_N, QB_PAD], tl.float32)  # G[j, c] = sum_i dS(i, j) hot(i, c)

    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dcol = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, N_Q, BLOCK_M):
        offs_m, row_ok, q, hot_t = _query_block(  # hot_t: (SPLIT*QB_PAD, BLOCK_M)
            Q, st_q, QID, b, h, B, N_Q, start_m, offs_d, offs_e % QB_PAD, BLOCK_M, TABLE, N_TABLES, True
        )
        do, lse, delta = _row_grads(DO, st_g, LSE, DELTA, bh, b, h, offs_m, row_ok, offs_d, N_Q)
        sT = _score(k, tl.trans(q), e, hot_t, col, qk_scale, tab, QID, KID, b, B, N_Q, N_K,
                    offs_m, offs_n, row_ok, col_ok, TABLE, N_TABLES, True, UPCAST, PREC)
        pT = tl.math.exp2(sT - lse[None, :])  # (BLOCK_N, BLOCK_M); 0 for masked keys and dead rows
        dv = _mm(pT.to(do.dtype), do, dv, UPCAST, PREC)
        dpT = _mm(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), UPCAST, PREC)
        dsT = pT * (dpT - delta[None, :])  # dL/ds in natural units, fp32
        dk = _mm(dsT.to(q.dtype), q, dk, UPCAST, PREC)
        if NEED_DCOL:
            dcol += tl.sum(dsT, 1)
        if NEED_DTAB and TABLE == 1:
            g = _split_mm(dsT, _query_hot(QID, b, B, N_Q, offs_m, row_ok, offs_c, N_TABLES, False), g, SPLIT, UPCAST)
        if NEED_DTAB and TABLE == 2:
            for t in tl.static_range(N_TABLES):
                ptrs, ok = _table_ptrs(DTAB + h * TAB_H, QID, KID, t, b, B, N_Q, N_K, offs_m, offs_n, row_ok, col_ok, True)
                tl.atomic_add(ptrs, dsT, mask=ok)
    out = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + bh * N_K * HEAD_DIM + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + bh * N_K * HEAD_DIM + out, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])
    if NEED_DCOL:
        tl.store(DCOL + bh * N_K + offs_n, dcol, mask=col_ok)
    if NEED_DTAB and TABLE == 1:
        g_ptrs = DTAB + (bh * N_K + offs_n[:, None]) * QB_PAD + offs_c[None, :]  # G (B, H, N_K, QB_PAD)
        tl.store(g_ptrs, g, mask=col_ok[:, None])


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ,  # DQ (B, H, N_Q, HEAD_DIM)
    TAB, EK, QID, KID, COL, qk_scale, sm_scale,
    st_q, st_k, st_v, st_g, st_e, st_c,
    B, H, N_Q, N_K, TAB_H, N_BUCKET, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TABLE: tl.constexpr, N_TABLES: tl.constexpr, QB_PAD: tl.constexpr, SPLIT: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    """One program per query block, looping over key blocks: dQ = scale dS K."""
    tl.static_assert(BLOCK_M >= 16 and BLOCK_N >= 16 and HEAD_DIM >= 16, "tl.dot tiles must be >= 16")
    pid_m, bh, b, h = _program(H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_e = tl.arange(0, SPLIT * QB_PAD)
    offs_m, row_ok, q, hot = _query_block(  # hot: (BLOCK_M, SPLIT*QB_PAD), loop-invariant
        Q, st_q, QID, b, h, B, N_Q, pid_m * BLOCK_M, offs_d, offs_e % QB_PAD, BLOCK_M, TABLE, N_TABLES, False
    )
    do, lse, delta = _row_grads(DO, st_g, LSE, DELTA, bh, b, h, offs_m, row_ok, offs_d, N_Q)
    tab = TAB + h * TAB_H

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        offs_n, col_ok, k, e, col = _key_block(K, st_k, EK, st_e, COL, st_c, b, h, N_K, start_n, offs_d, offs_e, BLOCK_N, TABLE)
        v = _tile(V, st_v, b, h, offs_n, col_ok, offs_d)
        s = _score(q, tl.trans(k), hot, tl.trans(e), col, qk_scale, tab, QID, KID, b, B, N_Q, N_K,
                   offs_m, offs_n, row_ok, col_ok, TABLE, N_TABLES, False, UPCAST, PREC)
        p = tl.math.exp2(s - lse[:, None])
        dp = _mm(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), UPCAST, PREC)
        ds = p * (dp - delta[:, None])  # dL/ds in natural units, fp32
        dq = _mm(ds.to(k.dtype), k, dq, UPCAST, PREC)
    out = DQ + bh * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ------------------------------------------------------------------------------------------------
# autotuning: short lists, tried once per (N bucket, head dim, bias mode, dtype)
# ------------------------------------------------------------------------------------------------

_KEY = ["N_BUCKET", "HEAD_DIM", "TABLE", "N_TABLES", "QB_PAD", "SPLIT"]


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
_dq = triton.autotune(_DQ + _DQ32, key=_KEY, prune_configs_by=_by_dtype(_DQ32, _DQ))(_attn_bwd_dq)

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
    """Shapes, flags and prepared side inputs shared by forward and backward launches.

    ``tables`` are the bias's (table (H, QB_t, KB_t), qb (B, Nq), kb (B, Nk)) triples, shapes as
    checked by :meth:`Bias.check`; ``col`` is :meth:`Bias.column` (B, H or 1, Nk).
    """

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, col: Tensor, tables: Sequence[tuple[Tensor, Tensor, Tensor]],
                 scale: float | None):
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

        if col.dim() != 3 or col.shape[0] != self.B or col.shape[2] != self.NK or col.shape[1] not in (1, self.H):
            raise ValueError(f"col must be (B, H or 1, Nk) = ({self.B}, {self.H}, {self.NK}); got {tuple(col.shape)}")
        self.col2 = (col.float() * LOG2E).contiguous()  # (B, H|1, Nk), log2 units
        self.st_c = (self.col2.stride(0), self.col2.stride(1) if self.col2.shape[1] == self.H else 0)  # (batch, head)

        self.sizes = [(t.shape[1], t.shape[2]) for t, _, _ in tables]  # (QB_t, KB_t)
        self.kbs = [kb.long() for _, _, kb in tables]  # (B, Nk) each
        n_query = sum(qb for qb, _ in self.sizes)
        self.table_mode = 0 if not tables else 1 if n_query <= ONEHOT_MAX_BUCKETS else 2
        self.qb_pad = _pow2(n_query)
        dummy_i = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.tab2, self.ekey, self.qid, self.kid, self.tab_h = self.dummy_f, self.dummy_f, dummy_i, dummy_i, 0
        self.st_e = (0, 0, 0)
        if tables:
            self._prepare_tables(tables)

    def _prepare_tables(self, tables: Sequence[tuple[Tensor, Tensor, Tensor]]) -> None:
        for n, ((_, qb, _), (nq, nk), kb) in enumerate(zip(tables, self.sizes, self.kbs)):
            for name, ids, size in (("qb", qb, nq), ("kb", kb, nk)):
                if ids.numel():  # device-side check: no host sync on CUDA
                    torch._assert_async(
                        (ids.min() >= 0) & (ids.max() < size), f"table {n}: {name} bucket ids must lie in [0, {size})"
                    )
        tab2 = [t.detach().float() * LOG2E for t, _, _ in tables]  # (H, QB_t, KB_t) each, log2 units
        if self.table_mode == 1:
            # table t owns query-bucket columns [off_t, off_t + QB_t); E[b, h, j, :] = its row T_t[h, :, kb_t(j)]
            # in those columns, as bf16 terms side by side (disjoint columns: the sum over tables is exact)
            offs = [sum(nq for nq, _ in self.sizes[:t]) for t in range(len(tables))]
            self.qid = torch.stack([qb + off for (_, qb, _), off in zip(tables, offs)]).to(torch.int32).contiguous()
            ekey = None
            for t2, kb, off, (nq, _) in zip(tab2, self.kbs, offs, self.sizes):
                slot = F.pad(t2.transpose(1, 2), (off, self.qb_pad - off - nq))  # (H, KB_t, QB_PAD)
                rows = _bf16_terms(slot, self.split)[:, kb]  # (H, B, Nk, SPLIT*QB_PAD)
                ekey = rows if ekey is None else ekey + rows
            self.ekey = ekey.transpose(0, 1)  # (B, H, Nk, SPLIT*QB_PAD) view
            self.st_e = tuple(self.ekey.stride()[:3])
            self.offs = offs
        else:
            # the tables flattened side by side per head: T_t[h, a, c] at h * TAB_H + off_t + a * KB_t + c
            self.offs = [sum(nq * nk for nq, nk in self.sizes[:t]) for t in range(len(tables))]
            self.tab2 = torch.cat([t.reshape(self.H, -1) for t in tab2], dim=1).contiguous()  # (H, TAB_H)
            self.tab_h = self.tab2.shape[1]
            rows = [off + qb.long() * nk for (_, qb, _), off, (_, nk) in zip(tables, self.offs, self.sizes)]
            self.qid = torch.stack(rows).to(torch.int32).contiguous()  # (T, B, Nq)
            self.kid = torch.stack(self.kbs).to(torch.int32).contiguous()  # (T, B, Nk)

    def consts(self) -> dict:
        return {
            "HEAD_DIM": self.d_pad, "TABLE": self.table_mode, "N_TABLES": max(len(self.sizes), 1),
            "QB_PAD": self.qb_pad, "SPLIT": self.split, "UPCAST": INTERPRET, "PREC": _dot_precision(self.dtype),
        }

    def side_args(self) -> tuple:
        return (self.tab2, self.ekey, self.qid, self.kid, self.col2)

    def dims(self) -> tuple:
        return (self.B, self.H, self.NQ, self.NK, self.tab_h, _pow2(self.NK))

    def table_grads(self, dtab: Tensor) -> list[Tensor]:
        """Each table's (H, QB_t, KB_t) fp32 gradient from the kernel's G (TABLE 1) or flat dT (TABLE 2)."""
        if self.table_mode == 2:
            return [dtab[:, off:off + nq * nk].reshape(self.H, nq, nk) for off, (nq, nk) in zip(self.offs, self.sizes)]
        g = dtab.view(self.B, self.H, self.NK, self.qb_pad).transpose(1, 2).reshape(self.B * self.NK, self.H, -1)
        grads = []
        for off, (nq, nk), kb in zip(self.offs, self.sizes, self.kbs):
            per_kb = _sum_by_bucket(g[:, :, off:off + nq].reshape(self.B * self.NK, -1), kb.reshape(-1), nk)
            grads.append(per_kb.view(nk, self.H, nq).permute(1, 2, 0))  # (H, QB_t, KB_t)
        return grads


def _check_device(x: Tensor) -> None:
    if x.device.type != "cuda" and not INTERPRET:
        raise RuntimeError(
            f"the Triton attention kernel needs CUDA tensors; got {x.device}. Use backend='sdpa' or 'reference' "
            "on CPU, or set TRITON_INTERPRET=1 before the first Triton launch to run the (slow) interpreter"
        )


def _padded(plan: _Plan, *xs: Tensor) -> list[Tensor]:
    """(B, H, N, D) tensors zero-padded to the kernel's head dim, last stride 1."""
    return [_stride_last(_pad_head(x, plan.d_pad)) for x in xs]


def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, col: Tensor, tables: Sequence[tuple[Tensor, Tensor, Tensor]],
    scale: float | None, residual: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Fused forward. Shapes: q (B, H, Nq, D), k/v (B, H, Nk, D), col (B, H|1, Nk) natural-log units
    (-inf = masked key), tables as in :class:`_Plan`. Returns o (B, H, Nq, D) in q's dtype, lse
    (B*H, Nq) fp32 in log2 units (+inf for rows with no unmasked key) and, if ``residual`` and o is
    16-bit, o's rounding residual (B, H, Nq, D_pad) bf16. With it backward's delta = rowsum(dO * O)
    sees o before its final 16-bit rounding, which about halves the error of dT and dcol (sums of
    terms that cancel row by row); what remains comes from P being rounded to 16 bits for P @ V, as
    in FlashAttention."""
    _check_device(q)
    plan = _Plan(q, k, v, col, tables, scale)
    B, H, NQ, D = plan.B, plan.H, plan.NQ, plan.D
    qp, kp, vp = _padded(plan, q, k, v)  # (B, H, N, d_pad)
    o = torch.empty(B, H, NQ, plan.d_pad, device=q.device, dtype=q.dtype)
    lse = torch.empty(B * H, NQ, device=q.device, dtype=torch.float32)
    residual = residual and q.dtype != torch.float32
    res = torch.zeros_like(o, dtype=torch.bfloat16) if residual else None
    if NQ and plan.NK:

        def grid(meta: dict) -> tuple[int, int]:
            return (triton.cdiv(NQ, meta["BLOCK_M"]), B * H)

        _fwd[grid](
            qp, kp, vp, o, lse, res if residual else plan.dummy_f, *plan.side_args(), plan.scale * LOG2E,
            *(x.stride()[:3] for x in (qp, kp, vp, o)), plan.st_e, plan.st_c, *plan.dims(), **plan.consts(), RESID=residual,
        )
    else:  # no keys at all: every row is all-masked
        o.zero_()
        lse.fill_(float("inf"))
    return o[..., :D], lse, res


def attention_backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, res: Tensor | None, col: Tensor,
    tables: Sequence[tuple[Tensor, Tensor, Tensor]], scale: float | None, need_dtables: bool, need_dcol: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, list[Tensor] | None]:
    """Fused backward (``o``, ``lse``, ``res`` from :func:`attention_forward`). Returns dq, dk, dv like
    q, k, v; dcol (B, H, Nk) fp32 (= sum_i dS) and each table's (H, QB_t, KB_t) fp32 gradient."""
    _check_device(q)
    plan = _Plan(q, k, v, col, tables, scale)
    B, H, NQ, NK, D, dp_ = plan.B, plan.H, plan.NQ, plan.NK, plan.D, plan.d_pad
    qp, kp, vp, op, dop = _padded(plan, q, k, v, o, do)  # (B, H, N, d_pad)
    dq = torch.empty(B, H, NQ, dp_, device=q.device, dtype=q.dtype)
    dk = torch.empty(B, H, NK, dp_, device=q.device, dtype=q.dtype)
    dv = torch.empty(B, H, NK, dp_, device=q.device, dtype=q.dtype)
    need_dtables = need_dtables and plan.table_mode != 0
    dcol = torch.empty(B * H, NK, device=q.device, dtype=torch.float32) if need_dcol else plan.dummy_f
    if need_dtables and plan.table_mode == 1:  # G (B, H, Nk, QB_PAD), every row written by its key block
        dtab = torch.empty(B * H * NK * plan.qb_pad, device=q.device, dtype=torch.float32)
    elif need_dtables:  # atomics accumulate into the flat dT
        dtab = torch.zeros(H, plan.tab_h, device=q.device, dtype=torch.float32)
    else:
        dtab = plan.dummy_f
    if NQ == 0 or NK == 0:
        for g in (dq, dk, dv, dcol, dtab):
            g.zero_()
    else:
        delta = torch.empty(B * H, NQ, device=q.device, dtype=torch.float32)
        bm = 16 if INTERPRET else 64
        if res is not None and res.stride() != op.stride():
            raise ValueError(f"residual strides {res.stride()} differ from o's {op.stride()}; pass attention_forward's")
        _attn_bwd_delta[(triton.cdiv(NQ, bm), B * H)](
            op, res if res is not None else plan.dummy_f, dop, delta, op.stride()[:3], dop.stride()[:3], H, NQ,
            HEAD_DIM=dp_, BLOCK_M=bm, RESID=res is not None,
        )
        common = (
            *plan.side_args(), plan.scale * LOG2E, plan.scale,
            *(x.stride()[:3] for x in (qp, kp, vp, dop)), plan.st_e, plan.st_c, *plan.dims(),
        )

        def grid_n(meta: dict) -> tuple[int, int]:
            return (triton.cdiv(NK, meta["BLOCK_N"]), B * H)

        def grid_m(meta: dict) -> tuple[int, int]:
            return (triton.cdiv(NQ, meta["BLOCK_M"]), B * H)

        _dkdv[grid_n](
            qp, kp, vp, dop, lse, delta, dk, dv, dcol, dtab, *common, **plan.consts(),
            NEED_DCOL=need_dcol, NEED_DTAB=need_dtables,
        )
        _dq[grid_m](qp, kp, vp, dop, lse, delta, dq, *common, **plan.consts())
    dtables = plan.table_grads(dtab) if need_dtables else None
    return dq[..., :D], dk[..., :D], dv[..., :D], dcol.view(B, H, NK) if need_dcol else None, dtables


# ------------------------------------------------------------------------------------------------
# 3. autograd
# ------------------------------------------------------------------------------------------------


class BiasedAttentionFn(torch.autograd.Function):
    """softmax(q k^T * scale + sum_t T_t[qb_t, kb_t] + col) v, fused; saves the inputs, O and the row
    LSE (plus O's rounding residual when a table or col needs a gradient and O is 16-bit): O(N) memory.

    Inputs: q, k, v, col, scale, grad_enabled, the number of tables n, then the n tables, their n qb
    and their n kb (tensors as arguments, so autograd sees each table)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, col: Tensor, scale: float | None, grad_enabled: bool,
                n: int, *tables_qb_kb: Tensor) -> Tensor:
        tables = list(zip(tables_qb_kb[:n], tables_qb_kb[n:2 * n], tables_qb_kb[2 * n:]))
        # o's rounding residual takes o's final 16-bit rounding out of backward's delta: about half
        # the dT / dcol error for 16-bit inputs (those sums cancel row by row) for O(N D) memory
        need = ctx.needs_input_grad  # True under no_grad too, hence the grad-mode flag
        residual = grad_enabled and bool(need[3] or any(need[7:7 + n]))
        o, lse, res = attention_forward(q, k, v, col, tables, scale, residual)
        ctx.save_for_backward(q, k, v, o, lse, res, col, *tables_qb_kb)
        ctx.scale, ctx.n = scale, n
        return o

    @staticmethod
    def backward(ctx: Any, do: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, o, lse, res, col, *tables_qb_kb = ctx.saved_tensors
        n, need = ctx.n, ctx.needs_input_grad
        tables = list(zip(tables_qb_kb[:n], tables_qb_kb[n:2 * n], tables_qb_kb[2 * n:]))
        dq, dk, dv, dcol, dtables = attention_backward(
            do, q, k, v, o, lse, res, col, tables, ctx.scale, need_dtables=any(need[7:7 + n]), need_dcol=need[3],
        )
        if dcol is not None and col.shape[1] == 1:
            dcol = dcol.sum(dim=1, keepdim=True)  # (B, 1, Nk): col was shared by all heads
        dtabs = [None] * n if dtables is None else [g.to(t.dtype) for g, (t, _, _) in zip(dtables, tables)]
        return (dq, dk, dv, dcol, None, None, None, *dtabs, *[None] * (2 * n))


# ------------------------------------------------------------------------------------------------
# 4. the public function
# ------------------------------------------------------------------------------------------------


def attention_triton(q: Tensor, k: Tensor, v: Tensor, bias: Bias, scale: float | None = None) -> Tensor:
    """Fused (Triton) bias-aware attention; O(N) memory, gradients for q, k, v, every table and every
    column part (through :meth:`Bias.column`).

    Args:
        q: (B, H, Nq, D) queries, fp16/bf16/fp32 (accumulation is fp32). D <= 128; other D than
            16/32/64/128 are zero-padded to the next power of two.
        k, v: (B, H, Nk, D) keys and values, same dtype as q.
        bias: the :class:`hir_kernels.Bias`. With at most 32 query buckets over all its tables the
            tables' bias and gradient go through one-hot tensor-core dots and dT is deterministic;
            with more they are gathered per (i, j) and dT is accumulated with fp32 atomics.
        scale: score scale, default 1/sqrt(D).

    Returns:
        (B, H, Nq, D) in q's dtype: softmax_j(s_h(i, j)) @ v, the score as in ``bias.py``.
    """
    b, h, nq, _ = q.shape
    bias.check(b, h, nq, k.shape[2])
    col = bias.column(b, k.shape[2], q.device)  # (B, H|1, Nk)
    ts = bias.tables
    return BiasedAttentionFn.apply(
        q, k, v, col, scale, torch.is_grad_enabled(), len(ts),
        *[t.table for t in ts], *[t.qb for t in ts], *[t.kb for t in ts],
    )


__all__ = ["INTERPRET", "ONEHOT_MAX_BUCKETS", "BiasedAttentionFn", "attention_backward", "attention_forward",
           "attention_triton"]
