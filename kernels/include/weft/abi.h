// Plain-old-data structs shared by kernels and Rust (bound with bindgen in crates/kernels).
// Rules: fixed-width types only; no C++ in these headers; one concept per header.
#pragma once
#include "weft/roundtrip.h"
