// Experiment driver (not part of weft): runs weft's collective kernel (KFILE) on two GPUs of one
// process, timed as `weft bench collectives` times it (20 calls per graph; eager with events).
#include KFILE
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

struct Dev { cudaStream_t s; float* in; float* out; uint8_t* staging; uint64_t* flags; uint64_t* state; void* err; };
Dev dev[2];
constexpr uint64_t kMaxN = 1 << 22, kSlot = 16 << 20, kSent = 16 << 20;

struct Case { const char* name; int algo; uint64_t n; int proto; int blocks; };

weft_collective_params params(int d, const Case& c, int* blocks) {
  weft_collective_params p{};
  p.input = (uint64_t)dev[d].in; p.output = (uint64_t)dev[d].out;
  for (int r = 0; r < 2; ++r) { p.staging.base[r] = (uint64_t)dev[r].staging; p.flags.view.base[r] = (uint64_t)dev[r].flags; }
  p.staging.shape = {1, 1, 18, (uint32_t)kSlot}; p.staging.rank = d; p.staging.world = 2; p.staging.elem_bytes = 1;
  p.flags.view.shape = {2, 1, 2, 128}; p.flags.view.rank = d; p.flags.view.world = 2; p.flags.view.elem_bytes = 8;
  p.flags.bound.error_slot = (uint64_t)dev[d].err; p.flags.bound.budget_cycles = 20000000000ull;
  p.slot_bytes = kSlot; p.state = (uint64_t)dev[d].state; p.algo = c.algo;
  p.sentinel_bytes = kSent;
  const uint64_t words = c.n;
  if (c.proto == WEFT_COLL_PROTO_LL) {
    p.protocol = WEFT_COLL_PROTO_LL; p.count = p.shard = p.window = c.n; p.rounds = 1;
    *blocks = (int)std::max<uint64_t>(16, std::min<uint64_t>(64, (words + 511) / 512));
  } else if (c.proto == WEFT_COLL_PROTO_SENTINEL) {
    p.protocol = WEFT_COLL_PROTO_SENTINEL; p.count = p.shard = p.window = c.n; p.rounds = 1;
    *blocks = c.blocks;
  } else {
    p.protocol = WEFT_COLL_PROTO_SIMPLE; p.count = p.shard = c.n;
    p.window = std::min<uint64_t>(kSlot / 4, (c.n + 3) / 4 * 4); p.rounds = (uint32_t)((c.n + p.window - 1) / p.window);
    *blocks = (int)std::min<uint64_t>(64, (p.window * 4 + 8191) / 8192);
  }
  return p;
}

void measure(const Case& c) {
  weft_collective_params p[2];
  int blocks = 0;
  for (int d = 0; d < 2; ++d) p[d] = params(d, c, &blocks);
  auto launch = [&](int d) { weft_collective_f32<<<blocks, 512, 0, dev[d].s>>>(p[d]); CK(cudaGetLastError()); };
  for (int i = 0; i < 20; ++i) for (int d = 0; d < 2; ++d) { CK(cudaSetDevice(d)); launch(d); }
  for (int d = 0; d < 2; ++d) { CK(cudaSetDevice(d)); CK(cudaStreamSynchronize(dev[d].s)); }
  const int calls = 20, replays = 40;
  cudaGraphExec_t ge[2];
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(dev[d].s, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < calls; ++i) launch(d);
    CK(cudaStreamEndCapture(dev[d].s, &g));
    CK(cudaGraphInstantiate(&ge[d], g, 0));
    CK(cudaGraphDestroy(g));
  }
  std::vector<cudaEvent_t> ev[2];
  for (int d = 0; d < 2; ++d) { CK(cudaSetDevice(d)); ev[d].resize(2 * replays); for (auto& e : ev[d]) CK(cudaEventCreate(&e)); }
  for (int r = -3; r < replays; ++r)
    for (int d = 0; d < 2; ++d) {
      CK(cudaSetDevice(d));
      if (r >= 0) CK(cudaEventRecord(ev[d][2 * r], dev[d].s));
      CK(cudaGraphLaunch(ge[d], dev[d].s));
      if (r >= 0) CK(cudaEventRecord(ev[d][2 * r + 1], dev[d].s));
    }
  double worst = 0;
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d)); CK(cudaStreamSynchronize(dev[d].s));
    std::vector<float> ms(replays);
    for (int r = 0; r < replays; ++r) CK(cudaEventElapsedTime(&ms[r], ev[d][2 * r], ev[d][2 * r + 1]));
    std::sort(ms.begin(), ms.end());
    worst = std::max(worst, double(ms[replays / 2]) / calls * 1e3);
    CK(cudaGraphExecDestroy(ge[d]));
  }
  // one more call, checked: AllReduce a + b; ReduceScatter shard d of a + b; AllGather a | b
  for (int d = 0; d < 2; ++d) { CK(cudaSetDevice(d)); CK(cudaMemset(dev[d].out, 0xff, kMaxN * 8)); launch(d); }
  int bad = 0;
  std::vector<float> a(2 * kMaxN), b(2 * kMaxN), o(2 * kMaxN);
  CK(cudaSetDevice(0)); CK(cudaMemcpy(a.data(), dev[0].in, 2 * kMaxN * 4, cudaMemcpyDeviceToHost));
  CK(cudaSetDevice(1)); CK(cudaMemcpy(b.data(), dev[1].in, 2 * kMaxN * 4, cudaMemcpyDeviceToHost));
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); CK(cudaMemcpy(o.data(), dev[d].out, 2 * kMaxN * 4, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < c.n; ++i) {
      if (c.algo == WEFT_COLL_ALL_GATHER) bad += o[i] != a[i] || o[c.n + i] != b[i];
      else if (c.algo == WEFT_COLL_REDUCE_SCATTER) bad += o[i] != a[d * c.n + i] + b[d * c.n + i];
      else bad += o[i] != a[i] + b[i];
    }
  }
  printf("%-14s %8llu B  blocks %3d  %s  graph %6.2f us/call  bad=%d\n", c.name, (unsigned long long)(c.n * 4), blocks,
         p[0].protocol == WEFT_COLL_PROTO_LL ? "LL    " : p[0].protocol == WEFT_COLL_PROTO_SENTINEL ? "sentin" : "simple", worst, bad);
  fflush(stdout);
}

int main() {
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  if (count < 2) { printf("needs 2 GPUs, found %d\n", count); return 1; }
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaStreamCreateWithFlags(&dev[d].s, cudaStreamNonBlocking));
    CK(cudaMalloc(&dev[d].in, 2 * kMaxN * 4)); CK(cudaMalloc(&dev[d].out, 2 * kMaxN * 4));
    CK(cudaMalloc(&dev[d].staging, 18 * kSlot + 6 * kSent)); CK(cudaMemset(dev[d].staging, 0, 18 * kSlot)); CK(cudaMemset(dev[d].staging + 18 * kSlot, 0xff, 6 * kSent));
    CK(cudaMalloc(&dev[d].flags, 2 * 2 * 128 * 8)); CK(cudaMemset(dev[d].flags, 0, 2 * 2 * 128 * 8));
    CK(cudaMalloc(&dev[d].state, 128 * 8)); CK(cudaMemset(dev[d].state, 0, 128 * 8));
    CK(cudaMalloc(&dev[d].err, 4096)); CK(cudaMemset(dev[d].err, 0, 4096));
    std::vector<float> h(2 * kMaxN);
    for (uint64_t i = 0; i < 2 * kMaxN; ++i) h[i] = float(int(i % 97) - 48 + 7 * d);
    CK(cudaMemcpy(dev[d].in, h.data(), 2 * kMaxN * 4, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
  }
  std::vector<Case> cases;
  const int AR = WEFT_COLL_ALL_REDUCE_ONE_SHOT, RS = WEFT_COLL_REDUCE_SCATTER, AG = WEFT_COLL_ALL_GATHER;
  const int LL = WEFT_COLL_PROTO_LL, SE = WEFT_COLL_PROTO_SENTINEL, SI = WEFT_COLL_PROTO_SIMPLE;
  for (uint64_t bytes : {4096ull, 65536ull, 262144ull, 524288ull, 1048576ull, 2097152ull, 4194304ull}) {
    const uint64_t n = bytes / 4;
    if (bytes <= 262144) cases.push_back({"all_reduce", AR, n, LL, 0});
    if (bytes >= 262144) cases.push_back({"all_reduce", AR, n, SI, 0});
    for (int b : {16, 32, 64, 128}) cases.push_back({"all_reduce", AR, n, SE, b});
  }
  for (uint64_t bytes : {4096ull, 262144ull, 1048576ull}) {
    const uint64_t n = bytes / 8;  // per rank at world 2, bytes the total as nccl-tests counts
    for (int algo : {RS, AG}) {
      cases.push_back({algo == RS ? "reduce_scatter" : "all_gather", algo, n, bytes <= 524288 ? LL : SI, 0});
      for (int b : {16, 64, 128}) cases.push_back({algo == RS ? "reduce_scatter" : "all_gather", algo, n, SE, b});
    }
  }
  for (int rep = 0; rep < 2; ++rep)
    for (const Case& c : cases) measure(c);
  printf("done\n");
  return 0;
}
