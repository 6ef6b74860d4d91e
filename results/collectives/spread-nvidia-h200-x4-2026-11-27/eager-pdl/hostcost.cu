// Host cost per call of the driver calls on weft's collective launch path (wall clock, many calls).
#include <cuda.h>
#include <cstdio>
#include <chrono>
#include <vector>
struct Params { unsigned long long w[50]; };  // ~400 bytes, as weft_collective_params
extern "C" __global__ void k(const __grid_constant__ Params p) { if (p.w[0] == 12345 && threadIdx.x == 999) asm volatile("trap;"); }
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { printf("%s failed %d\n", #x, r); return 1; } } while (0)
static double now_us() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d, 0)); CUcontext c; CK(cuDevicePrimaryCtxRetain(&c, d)); CK(cuCtxSetCurrent(c));
  CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a, b; CK(cuMemAlloc(&a, 1 << 20)); CK(cuMemAlloc(&b, 1 << 20));
  std::vector<CUdeviceptr> many(1000); for (auto& m : many) CK(cuMemAlloc(&m, 1 << 16));
  CUfunction f;
  cudaFuncGetAttributes(nullptr, k);  // force runtime registration
  CK((CUresult)cudaGetFuncBySymbol(&f, (const void*)k));
  const int n = 20000;
  int ord;
  double t0 = now_us();
  for (int i = 0; i < n; ++i) CK(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (i & 1) ? a : b + 64));
  double t1 = now_us();
  printf("cuPointerGetAttribute(DEVICE_ORDINAL): %.3f us/call (1002 allocations)\n", (t1 - t0) / n);
  CUcontext cur; t0 = now_us();
  for (int i = 0; i < n; ++i) { CK(cuCtxGetCurrent(&cur)); }
  t1 = now_us(); printf("cuCtxGetCurrent: %.3f us/call\n", (t1 - t0) / n);
  Params p{}; void* args[] = {&p};
  CUlaunchAttribute attr; attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; attr.value.programmaticStreamSerializationAllowed = 1;
  for (int na = 0; na < 2; ++na) for (int threads : {32, 512}) {
    CUlaunchConfig cfg{}; cfg.gridDimX = 64; cfg.gridDimY = cfg.gridDimZ = 1; cfg.blockDimX = threads; cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s; cfg.attrs = &attr; cfg.numAttrs = na;
    for (int i = 0; i < 1000; ++i) CK(cuLaunchKernelEx(&cfg, f, args, nullptr));
    CK(cuStreamSynchronize(s));
    // Host rate: launches queue faster than the GPU drains only if the kernel is shorter than the launch.
    t0 = now_us();
    for (int i = 0; i < n; ++i) CK(cuLaunchKernelEx(&cfg, f, args, nullptr));
    t1 = now_us();
    CK(cuStreamSynchronize(s));
    double t2 = now_us();
    printf("cuLaunchKernelEx 64x%d, %d attrs: %.3f us/call host, %.3f us/call to drain\n", threads, na, (t1 - t0) / n, (t2 - t0) / n);
    // Host cost alone: batches of 50 launches into an idle stream (queue never full).
    double host = 0;
    for (int rep = 0; rep < 200; ++rep) {
      t0 = now_us();
      for (int i = 0; i < 50; ++i) CK(cuLaunchKernelEx(&cfg, f, args, nullptr));
      host += now_us() - t0;
      CK(cuStreamSynchronize(s));
    }
    printf("  host only (batches of 50): %.3f us/call\n", host / (200 * 50));
  }
  CUevent e; CK(cuEventCreate(&e, CU_EVENT_DEFAULT));
  t0 = now_us(); for (int i = 0; i < n; ++i) CK(cuEventRecord(e, s)); t1 = now_us();
  printf("cuEventRecord: %.3f us/call\n", (t1 - t0) / n);
  return 0;
}
