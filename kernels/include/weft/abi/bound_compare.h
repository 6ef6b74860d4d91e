// Parameters of the harness's tolerance check (kernels/harness/bound_compare.cu): counts the
// elements of a bf16 result outside a per-element bound of a bf16 reference, and the first one.
// Plain C, read by bindgen.
#pragma once
#include <stdint.h>

typedef struct weft_bound_compare_params {
  uint64_t got;   // device address: bf16 bits
  uint64_t want;  // device address: bf16 bits
  // Element i passes when |got - want| <= bound[i] * bound_scale + rel * |want| + abs
  // (bound may be 0: no per-element term). A NaN never passes.
  uint64_t bound;  // device address: f32, or 0
  float bound_scale;
  float rel;
  float abs;
  uint64_t count;
  // result[0] += elements outside the bound; result[1] = min index of one (the host zeroes [0]
  // and sets [1] to UINT64_MAX first).
  uint64_t result;  // device address: two u64
} weft_bound_compare_params;

// |src[i]| (bf16 bits) as f32, for building a per-element bound on the device.
typedef struct weft_abs_to_f32_params {
  uint64_t src;  // device address: bf16 bits
  uint64_t dst;  // device address: f32
  uint64_t count;
} weft_abs_to_f32_params;
