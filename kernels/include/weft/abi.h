// Plain-old-data structs shared by kernels and Rust (bound with bindgen in crates/kernels), and
// the WEFT_HD functions over them (compiled for the host through bindgen's wrappers).
// Rules: C only, fixed-width types; one concept per header; every device buffer a uint64_t device
// address (its element type in the field's comment), cast by the device code that uses it.
#pragma once
#include "weft/abi/bound_compare.h"
#include "weft/abi/collectives.h"
#include "weft/abi/gemm.h"
#include "weft/abi/grpcoll.h"
#include "weft/abi/kernel_barrier.h"
#include "weft/abi/synthetic.h"
#include "weft/abi/pgl.h"
#include "weft/abi/roundtrip.h"
#include "weft/abi/sync.h"
#include "weft/abi/sync_checks.h"
#include "weft/abi/word_compare.h"
