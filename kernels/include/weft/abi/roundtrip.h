// Parameters of the harness round-trip kernel (kernels/harness/roundtrip.cu).
#pragma once
#include <stdint.h>

// output[i] = input[i] * scale + rank, for i < n. Passed to the kernel by value.
typedef struct weft_roundtrip_params {
  uint64_t input;   // device address: f32
  uint64_t output;  // device address: f32
  uint64_t n;
  float scale;
  int32_t rank;
} weft_roundtrip_params;
