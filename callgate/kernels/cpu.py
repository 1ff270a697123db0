"""Fast CPU backend for `apply_token_bitmask`: a tiny C loop, compiled once per process.

Knows: the bitmask layout and the bit patterns of -inf in float32 / float16 / bfloat16
(the body works on the logits' bits, so there are no float conversions). Does not know:
anything about grammars or batches beyond row numbers.

Why C: the body is one pass of `x = keep ? x : -inf` over the row, skipping the 32 logits
of a word whose bits are all set (a free-text state, or a lazy row held back from its
trigger, allows almost everything: the pass then touches only the few words with a banned
token) and writing -inf over a word with all 32 banned by stores alone (a forced token's
row: the pass is then a fill, bound by memory). Where the compiler targets AVX-512 (the
library is built with -march=native) the pass takes 16 words per compare and writes a
mixed word's banned lanes with masked stores, reading no logits; elsewhere the compiler
vectorises the portable loop (shifts and blends). Eager torch needs several full-size
temporaries and numba does not vectorise it.
The library is built with the system C compiler by callgate.kernels.native. Without a
compiler `available()` is False and the dispatcher in callgate.kernels falls back to the
plain-torch reference.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from callgate.kernels.launcher import MaskCall, Rows, check_call
from callgate.kernels.native import NativeUnavailable, compile_library

# One body per lane width; `keep` is all ones where the token is allowed. The entry masks
# rows of one bitmask matrix (`rows` given when only some rows are constrained, else the
# identity).
_SOURCE = r"""
#include <stdint.h>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define CG_AVX512 1
#include <immintrin.h>
/* AVX-512: a word's banned lanes take -inf by one masked store per 16 (or 32) lanes, with
   no load; a word with all 32 banned by plain stores. */
#define WORD_32(seg, m)                                                                   \
  do {                                                                                    \
    const __m512i ninf = _mm512_set1_epi32((int32_t)0xFF800000u);                         \
    if ((m) == 0u) {                                                                      \
      _mm512_storeu_si512((void *)(seg), ninf);                                           \
      _mm512_storeu_si512((void *)((seg) + 16), ninf);                                    \
    } else {                                                                              \
      _mm512_mask_storeu_epi32((void *)(seg), (__mmask16)~(m), ninf);                     \
      _mm512_mask_storeu_epi32((void *)((seg) + 16), (__mmask16)(~(m) >> 16), ninf);      \
    }                                                                                     \
  } while (0)
#define WORD_16(seg, m, NINF)                                                             \
  do {                                                                                    \
    const __m512i ninf = _mm512_set1_epi16((int16_t)(NINF));                              \
    if ((m) == 0u) _mm512_storeu_si512((void *)(seg), ninf);                              \
    else _mm512_mask_storeu_epi16((void *)(seg), (__mmask32)~(m), ninf);                  \
  } while (0)
#define WORD_callgate_mask_f32(seg, m) WORD_32(seg, m)
#define WORD_callgate_mask_f16(seg, m) WORD_16(seg, m, 0xFC00u)
#define WORD_callgate_mask_bf16(seg, m) WORD_16(seg, m, 0xFF80u)
#else
/* portable: plain stores over an all-banned word, a load-and-blend over a mixed one */
#define WORD_PORTABLE(seg, m, T, UT, NINF)                                                \
  do {                                                                                    \
    if ((m) == 0u) {                                                                      \
      for (int j = 0; j < 32; j++) (seg)[j] = (T)(NINF);                                  \
    } else {                                                                              \
      for (int j = 0; j < 32; j++) {                                                      \
        T keep = (T)(0u - (UT)(((m) >> j) & 1u));                                         \
        (seg)[j] = (T)(((seg)[j] & keep) | ((T)(NINF) & (T)~keep));                       \
      }                                                                                   \
    }                                                                                     \
  } while (0)
#define WORD_callgate_mask_f32(seg, m) WORD_PORTABLE(seg, m, int32_t, uint32_t, 0xFF800000u)
#define WORD_callgate_mask_f16(seg, m) WORD_PORTABLE(seg, m, int16_t, uint16_t, 0xFC00u)
#define WORD_callgate_mask_bf16(seg, m) WORD_PORTABLE(seg, m, int16_t, uint16_t, 0xFF80u)
#endif
/* The words from which the plain loop goes on: AVX-512 first takes 16 words at a time, one
   compare finding those with a banned token (a free-text or string state bans a few tokens:
   most words are passed over without a look at each). */
#ifdef CG_AVX512
#define SCAN_FN(NAME, T)                                                                  \
static inline int64_t NAME##_scan(T *restrict lg, const uint32_t *restrict mk, int64_t full) { \
  int64_t w = 0;                                                                          \
  const __m512i all = _mm512_set1_epi32(-1);                                              \
  for (; w + 16 <= full; w += 16) {                                                       \
    __m512i words = _mm512_loadu_si512((const void *)(mk + w));                            \
    __mmask16 todo = _mm512_cmpneq_epi32_mask(words, all);                                \
    if (!_mm512_test_epi32_mask(words, words)) { /* 16 words all banned (a forced token's row) */ \
      for (int j = 0; j < 16; j++) WORD_##NAME(lg + 32 * (w + j), 0u);                    \
      continue;                                                                           \
    }                                                                                     \
    while (todo) {                                                                        \
      int j = __builtin_ctz((unsigned)todo);                                              \
      todo &= (__mmask16)(todo - 1);                                                      \
      WORD_##NAME(lg + 32 * (w + j), mk[w + j]);                                          \
    }                                                                                     \
  }                                                                                       \
  return w;                                                                               \
}
#else
#define SCAN_FN(NAME, T)                                                                  \
static inline int64_t NAME##_scan(T *restrict lg, const uint32_t *restrict mk, int64_t full) { \
  (void)lg; (void)mk; (void)full;                                                         \
  return 0;                                                                               \
}
#endif
#define MASK_FN(NAME, T, UT, NINF)                                                        \
SCAN_FN(NAME, T)                                                                          \
static inline void NAME##_row(T *restrict lg, const uint32_t *restrict mk, int64_t vocab, \
                              int64_t n_words) {                                          \
  int64_t full = vocab / 32 < n_words ? vocab / 32 : n_words;                             \
  int64_t w = NAME##_scan(lg, mk, full);                                                  \
  for (; w < full; w++) {                                                                 \
    uint32_t m = mk[w];                                                                   \
    if (m == 0xFFFFFFFFu) continue; /* all 32 allowed: nothing to write */               \
    WORD_##NAME(lg + 32 * w, m);                                                          \
  }                                                                                       \
  for (int64_t t = 32 * full; t < vocab; t++) {                                           \
    uint32_t bit = (t >> 5) < n_words ? (mk[t >> 5] >> (t & 31)) & 1u : 0u;               \
    T keep = (T)(0u - (UT)bit);                                                           \
    lg[t] = (T)((lg[t] & keep) | ((T)NINF & (T)~keep));                                   \
  }                                                                                       \
}                                                                                         \
void NAME(T *restrict logits, int64_t row_stride, const uint32_t *restrict mask,          \
          int64_t mask_stride, const int64_t *restrict rows, int64_t n_rows,              \
          int64_t vocab, int64_t n_words) {                                               \
  for (int64_t i = 0; i < n_rows; i++) {                                                  \
    int64_t r = rows ? rows[i] : i;                                                       \
    NAME##_row(logits + r * row_stride, mask + r * mask_stride, vocab, n_words);          \
  }                                                                                       \
}
MASK_FN(callgate_mask_f32, int32_t, uint32_t, 0xFF800000u)
MASK_FN(callgate_mask_f16, int16_t, uint16_t, 0xFC00u)
MASK_FN(callgate_mask_bf16, int16_t, uint16_t, 0xFF80u)
"""

_SYMBOLS = {
    torch.float32: "callgate_mask_f32",
    torch.float16: "callgate_mask_f16",
    torch.bfloat16: "callgate_mask_bf16",
}


class CpuKernelUnavailable(RuntimeError):
    """No C compiler, or the library did not build; the reason is the message."""


def available() -> bool:
    """True when the compiled library loads on this machine (builds it on first call)."""
    try:
        _library()
    except CpuKernelUnavailable:
        return False
    return True


def apply_checked(call: MaskCall) -> None:
    """Mask an already-checked CPU call in place. Raises CpuKernelUnavailable."""
    logits, bitmask, rows = call.logits, call.bitmask, call.rows
    _functions()[logits.dtype](
        logits.data_ptr(),
        logits.stride(0),
        bitmask.data_ptr(),
        bitmask.stride(0),
        None if rows is None else rows.data_ptr(),
        logits.shape[0] if rows is None else rows.numel(),
        logits.shape[1],
        bitmask.shape[1],
    )


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: Rows = None) -> None:
    """Set disallowed logits to -inf in place (CPU tensors only; see callgate.kernels)."""
    call = check_call(logits, bitmask, indices)
    if call.logits.device.type != "cpu":
        raise ValueError(f"the CPU kernel needs CPU tensors, got {call.logits.device}")
    apply_checked(call)


def _library() -> ctypes.CDLL:
    try:
        return compile_library("mask", _SOURCE)
    except NativeUnavailable as exc:
        raise CpuKernelUnavailable(str(exc)) from exc


def row_kernels() -> dict[torch.dtype, Any]:
    """Per logits dtype, the unchecked C function behind `apply_checked` (see
    callgate.kernels.cpu_row_kernels). Raises CpuKernelUnavailable."""
    return _functions()


@functools.cache
def _functions() -> dict[torch.dtype, Any]:
    return entry_points(_library())


def entry_points(library: ctypes.CDLL) -> dict[torch.dtype, Any]:
    """Per logits dtype, the library's checked-call entry: for a library built from
    `_SOURCE` with other flags (tests build the portable loop too)."""
    # argtypes let ctypes take plain ints: about a microsecond less per call than wrapping.
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    table: dict[torch.dtype, Any] = {}
    for dtype, name in _SYMBOLS.items():
        fn = getattr(library, name)
        fn.argtypes = (ptr, i64, ptr, i64, ptr, i64, i64, i64)
        fn.restype = None
        table[dtype] = fn
    return table
