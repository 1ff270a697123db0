"""The argmax of float32 logits rows, as vLLM's greedy sampler takes it: a tiny C loop.

Knows: torch's argmax rule (the first index of the largest value; a NaN counts as the
largest, so a row holding one answers -1 here and its caller takes the slow way). Does not
know: grammars, masks, batches beyond row numbers.

Why: a greedy row whose argmax its grammar admits needs no mask at all (masking leaves that
argmax where it is), and asking the grammar about one token is ~1 µs against tens for a
mask (decoding/processor.py). With AVX-512 the pass is one read of the row (32 lanes a
step, each keeping its largest value and where it first saw it); elsewhere the plain loop
finds the largest value, then its first index.
Built by callgate.kernels.native; without a C compiler `available()` is False.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from callgate.kernels.native import NativeUnavailable, compile_library

_SOURCE = r"""
#include <stdint.h>
#if defined(__AVX512F__)
#include <immintrin.h>
/* One pass, two independent accumulators of 16 lanes (the compare-and-blend chain of one
   would bound the pass, not memory): each lane keeps its largest value and the first index
   it was seen at; the lanes are merged by value, then by the smaller index. */
static int64_t row_argmax(const float *restrict x, int64_t n, int *nan) {
  int64_t i = 0;
  float best = -__builtin_inff();
  int64_t at = 0;
  __mmask16 unordered = 0;
  if (n >= 32) {
    __m512 ma = _mm512_set1_ps(-__builtin_inff()), mb = ma;
    __m512i ia = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(16));
    __m512i ka = ia, kb = ib;
    const __m512i step = _mm512_set1_epi32(32);
    for (; i + 32 <= n; i += 32) {
      __m512 va = _mm512_loadu_ps(x + i), vb = _mm512_loadu_ps(x + i + 16);
      unordered |= _mm512_cmp_ps_mask(va, va, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(vb, vb, _CMP_UNORD_Q);
      __mmask16 ga = _mm512_cmp_ps_mask(va, ma, _CMP_GT_OQ), gb = _mm512_cmp_ps_mask(vb, mb, _CMP_GT_OQ);
      ma = _mm512_mask_mov_ps(ma, ga, va);
      ka = _mm512_mask_mov_epi32(ka, ga, ia);
      mb = _mm512_mask_mov_ps(mb, gb, vb);
      kb = _mm512_mask_mov_epi32(kb, gb, ib);
      ia = _mm512_add_epi32(ia, step);
      ib = _mm512_add_epi32(ib, step);
    }
    /* b's lane wins where it is larger, or equal and seen first */
    __mmask16 take = _mm512_cmp_ps_mask(mb, ma, _CMP_GT_OQ) |
                     (_mm512_cmp_ps_mask(mb, ma, _CMP_EQ_OQ) & _mm512_cmplt_epi32_mask(kb, ka));
    ma = _mm512_mask_mov_ps(ma, take, mb);
    ka = _mm512_mask_mov_epi32(ka, take, kb);
    best = _mm512_reduce_max_ps(ma);
    at = _mm512_mask_reduce_min_epi32(_mm512_cmp_ps_mask(ma, _mm512_set1_ps(best), _CMP_EQ_OQ), ka);
  } else {
    best = x[0];
  }
  int plain = 0;
  for (; i < n; i++) {
    float v = x[i];
    plain |= v != v;
    if (v > best) { best = v; at = i; }
  }
  *nan = unordered != 0 || plain;
  return at;
}
#else
/* The portable loop: the largest value, then its first index. */
static int64_t row_argmax(const float *restrict x, int64_t n, int *nan) {
  float best = x[0];
  int unordered = 0;
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    unordered |= v != v;
    best = v > best ? v : best;
  }
  *nan = unordered;
  for (int64_t i = 0; i < n; i++)
    if (x[i] == best) return i;
  return 0;
}
#endif
/* out[k]: the first index of the largest value of row rows[k], -1 where it holds a NaN. */
void callgate_argmax_f32(const float *restrict logits, int64_t row_stride, const int64_t *restrict rows,
                         int64_t n_rows, int64_t width, int64_t *restrict out) {
  for (int64_t k = 0; k < n_rows; k++) {
    int nan = 0;
    int64_t at = row_argmax(logits + rows[k] * row_stride, width, &nan);
    out[k] = nan ? -1 : at;
  }
}
"""


def available() -> bool:
    """True when the compiled loop loads on this machine (built on first call)."""
    try:
        argmax_rows_kernel()
    except NativeUnavailable:
        return False
    return True


@functools.cache
def argmax_rows_kernel() -> Any:
    """The unchecked C entry

        fn(logits_ptr, row_stride, rows_ptr, n_rows, width, out_ptr)

    writing to out[k] (int64) the argmax of float32 row rows[k] (int64) of `width` columns,
    or -1 where the row holds a NaN. The caller checks dtype, unit stride and rows.
    Raises NativeUnavailable."""
    fn = compile_library("argmax", _SOURCE).callgate_argmax_f32
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = (ptr, i64, ptr, i64, i64, ptr)
    fn.restype = None
    return fn
