// WEFT_HD marks a function usable from host and device code. Headers under weft/abi/ are plain C so
// that bindgen reads them; under nvcc the same functions compile for the device too, and on the
// host side crates/kernels compiles bindgen's wrappers of them with cc: one definition for both.
#pragma once
#ifdef __CUDACC__
#define WEFT_HD __host__ __device__ __forceinline__
#else
#define WEFT_HD static inline
#endif
// WEFT_HD_CONSTEXPR: the same, and under nvcc usable in constant expressions (sizes the kernels'
// static_asserts compare with their own).
#ifdef __CUDACC__
#define WEFT_HD_CONSTEXPR constexpr __host__ __device__ __forceinline__
#else
#define WEFT_HD_CONSTEXPR static inline
#endif
