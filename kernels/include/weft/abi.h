// Plain-old-data structs shared by kernels and Rust (bound with bindgen in crates/kernels), and
// the WEFT_HD functions over them (compiled for the host through bindgen's wrappers).
// Rules: C only, fixed-width types; one concept per header.
#pragma once
#include "weft/bound_compare.h"
#include "weft/collectives.h"
#include "weft/gemm.h"
#include "weft/grpcoll.h"
#include "weft/kernel_barrier.h"
#include "weft/overlap_work.h"
#include "weft/pgl.h"
#include "weft/roundtrip.h"
#include "weft/sync.h"
#include "weft/sync_checks.h"
#include "weft/word_compare.h"
