"""The argmax of float32 logits rows, as vLLM's greedy sampler takes it: a tiny C loop.

Knows: torch's argmax rule (the first index of the largest value; a NaN counts as the
largest, so a row holding one answers -1 here and its caller takes the slow way). Does not
know: grammars, masks, batches beyond row numbers.

Why: a greedy row whose argmax its grammar admits needs no mask at all (masking leaves that
argmax where it is), and asking the grammar about one token is ~1 µs against tens for a
mask (decoding/processor.py). The pass is one read of the row, bound by memory; with
AVX-512 it takes 16 lanes per compare, elsewhere the compiler vectorises the plain loop.
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
#endif
/* The largest value of x[0..n) and whether a NaN is among them. */
static float row_max(const float *restrict x, int64_t n, int *nan) {
  int64_t i = 0;
  float best = x[0];
  int unordered = 0;
#if defined(__AVX512F__)
  if (n >= 16) {
    __m512 m = _mm512_loadu_ps(x);
    __mmask16 u = 0;
    for (; i + 16 <= n; i += 16) {
      __m512 v = _mm512_loadu_ps(x + i);
      u |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      m = _mm512_max_ps(m, v);
    }
    unordered = u != 0;
    best = _mm512_reduce_max_ps(m);
  }
#endif
  for (; i < n; i++) {
    float v = x[i];
    unordered |= v != v;
    best = v > best ? v : best;
  }
  *nan = unordered;
  return best;
}
/* out[k]: the first index of the largest value of row rows[k], -1 where it holds a NaN. */
void callgate_argmax_f32(const float *restrict logits, int64_t row_stride, const int64_t *restrict rows,
                         int64_t n_rows, int64_t width, int64_t *restrict out) {
  for (int64_t k = 0; k < n_rows; k++) {
    const float *x = logits + rows[k] * row_stride;
    int nan = 0;
    float best = row_max(x, width, &nan);
    int64_t at = -1;
    if (!nan)
      for (int64_t i = 0; i < width; i++)
        if (x[i] == best) { at = i; break; }
    out[k] = at;
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
