// Parameters of the harness's bitwise comparison kernel (kernels/harness/word_compare.cu): counts
// the 32-bit words where two buffers differ and the first such word. Plain C, read by bindgen.
#pragma once
#include <stdint.h>

typedef struct weft_word_compare_params {
  uint64_t a;  // device address: u32 words
  uint64_t b;  // device address: u32 words
  uint64_t words;
  // result[0] += words that differ; result[1] = min index of one (the host zeroes [0] and sets
  // [1] to UINT64_MAX first).
  uint64_t result;  // device address: two u64
} weft_word_compare_params;
