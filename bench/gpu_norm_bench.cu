// Multi-tensor sum of squares over REAL bf16 gradient buffers in device memory, against the card's
// copy bandwidth, plus the time of local_stats_cuda (generated values) over the same shards.
//
// The shards: one rank's tensors of Qwen3-30B-A3B (hidden 2048, 32 query / 4 KV heads of 128,
// 128 experts of intermediate size 768, vocabulary 151936) under TP = ETP = 4, EP = 2 (64 local
// experts per layer), Hugging Face naming (q/k/v/o, q/k norms, router, each expert's gate/up/down
// projection, two layer norms): the embedding shard, then layer after layer, cut at exactly
// 2^log2 elements (default 2^30; the last tensor is shortened). About 2,500 tensors, from 128 to
// 77.8M elements, packed back to back in one buffer as a flat gradient buffer holds them.
//
// Measured, each as the median of --reps timed runs (CUDA events) after 3 warm-ups:
//   copy    cudaMemcpyAsync device to device of the same bytes; bandwidth = (read + write) / time
//   read    the multi-tensor kernel below, several variants; bandwidth = bytes read / time
//   stats   local_stats_cuda over the same shards (values generated on the device), wall clock
// The kernel: one launch over a work list of pieces (at most 64K elements of one tensor each),
// a persistent grid (blocks resident per SM x SMs) striding over the list, 16-byte vector loads
// (8 bf16) with kUnroll loads in flight per thread, a scalar head and tail for pieces that do not
// start or end on 16 bytes, fp32 squares and sums per thread, a fixed tree per block, per-block
// partials added in a fixed order in fp64 by a second launch: same bits on every run on one device
// and grid. Correctness: a small self-check with odd sizes and misaligned starts against a host
// fp64 sum, and the full result against local_stats_cuda's fp64 sum of the same values.
//
// Usage: gpu_norm_bench [--log2 N] [--reps N] [--sizes-out FILE] [--skip-stats]
// The sizes file (one "name numel" line per tensor, in buffer order) is what
// bench/torch_norm_bench.py reads to time PyTorch on the same shards in the same device call.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/detail/cuda_check.h"
#include "kernels/gradient_generator.h"
#include "kernels/local_stats.h"
#include "kernels/local_stats_cuda.h"

namespace {

using namespace tally::kernels;

// ---- The layout
// ----------------------------------------------------------------------------------

struct Tensor {
  std::string name;
  std::int64_t rows = 0, cols = 0;  // the (sharded) tensor's shape; cols = 0 for 1-d
  std::int64_t numel = 0;           // elements in the buffer (the last tensor may be cut)
};

std::vector<Tensor> qwen3_moe_rank(std::int64_t total) {
  constexpr std::int64_t hidden = 2048, heads = 32, kv_heads = 4, head_dim = 128, experts = 128,
                         moe_ffn = 768, vocab = 151936, tp = 4, etp = 4, ep = 2;
  std::vector<Tensor> out;
  std::int64_t used = 0;
  auto add = [&](std::string name, std::int64_t rows, std::int64_t cols) {
    if (used >= total) return false;
    const std::int64_t n = cols ? rows * cols : rows;
    const std::int64_t take = std::min(n, total - used);
    out.push_back(Tensor{std::move(name), rows, cols, take});
    used += take;
    return used < total;
  };
  add("embed_tokens", vocab / tp, hidden);
  for (int layer = 0; used < total; ++layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    add(p + "input_layernorm", hidden, 0);
    add(p + "self_attn.q_proj", heads * head_dim / tp, hidden);
    add(p + "self_attn.k_proj", kv_heads * head_dim / tp, hidden);
    add(p + "self_attn.v_proj", kv_heads * head_dim / tp, hidden);
    add(p + "self_attn.o_proj", hidden, heads * head_dim / tp);
    add(p + "self_attn.q_norm", head_dim, 0);
    add(p + "self_attn.k_norm", head_dim, 0);
    add(p + "post_attention_layernorm", hidden, 0);
    add(p + "mlp.gate", experts, hidden);
    for (int e = 0; e < experts / ep; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      add(x + "gate_proj", moe_ffn / etp, hidden);
      add(x + "up_proj", moe_ffn / etp, hidden);
      add(x + "down_proj", hidden, moe_ffn / etp);
    }
  }
  return out;
}

// ---- The multi-tensor kernel
// ---------------------------------------------------------------------

struct Piece {
  const std::uint16_t* ptr;  // bf16 bits
  std::int64_t n;
};
constexpr std::int64_t kPiece = 65536;
constexpr int kBlock = 512;

__device__ __forceinline__ float bf16_lo(std::uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(std::uint32_t w) {
  return __uint_as_float(w & 0xFFFF0000u);
}

template <bool kStreaming>
__device__ __forceinline__ uint4 load16(const uint4* p) {
  if constexpr (kStreaming)
    return __ldcs(p);  // evict-first: read once
  else
    return __ldg(p);  // read-only path
}

__device__ __forceinline__ void add8(float (&acc)[4], uint4 v) {
  acc[0] = fmaf(bf16_lo(v.x), bf16_lo(v.x), acc[0]);
  acc[1] = fmaf(bf16_lo(v.y), bf16_lo(v.y), acc[1]);
  acc[2] = fmaf(bf16_lo(v.z), bf16_lo(v.z), acc[2]);
  acc[3] = fmaf(bf16_lo(v.w), bf16_lo(v.w), acc[3]);
  acc[0] = fmaf(bf16_hi(v.x), bf16_hi(v.x), acc[0]);
  acc[1] = fmaf(bf16_hi(v.y), bf16_hi(v.y), acc[1]);
  acc[2] = fmaf(bf16_hi(v.z), bf16_hi(v.z), acc[2]);
  acc[3] = fmaf(bf16_hi(v.w), bf16_hi(v.w), acc[3]);
}

__device__ __forceinline__ float square_bf16(std::uint16_t bits) {
  const float x = __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
  return x * x;
}

template <int kUnroll, bool kStreaming>
__global__ void __launch_bounds__(kBlock)
    sumsq_bf16(const Piece* __restrict__ pieces, int n_pieces, double* __restrict__ partials) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int p = blockIdx.x; p < n_pieces; p += gridDim.x) {
    const Piece piece = pieces[p];
    const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(piece.ptr);
    std::int64_t head = static_cast<std::int64_t>(((16 - (address & 15)) & 15) / 2);
    head = head < piece.n ? head : piece.n;
    if (threadIdx.x < head) acc[0] += square_bf16(piece.ptr[threadIdx.x]);
    const uint4* vec = reinterpret_cast<const uint4*>(piece.ptr + head);
    const std::int64_t n_vec = (piece.n - head) / 8;
    std::int64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * kBlock < n_vec; i += kUnroll * kBlock) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = load16<kStreaming>(vec + i + u * kBlock);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) add8(acc, v[u]);
    }
    for (; i < n_vec; i += kBlock) add8(acc, load16<kStreaming>(vec + i));
    const std::int64_t tail = piece.n - head - n_vec * 8;
    if (threadIdx.x < tail) acc[1] += square_bf16(piece.ptr[head + n_vec * 8 + threadIdx.x]);
  }
  float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
#pragma unroll
  for (int width = 16; width > 0; width /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, width);
  __shared__ float warp_sums[kBlock / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < kBlock / 32 ? warp_sums[threadIdx.x] : 0.f;
#pragma unroll
    for (int width = 16; width > 0; width /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, width);
    if (threadIdx.x == 0) partials[blockIdx.x] = static_cast<double>(s);
  }
}

// Adds the per-block partials in a fixed order (fixed strided split, fixed tree).
__global__ void __launch_bounds__(256)
    add_partials(const double* __restrict__ partials, int n, double* __restrict__ out) {
  __shared__ double s[256];
  double sum = 0.0;
  for (int i = threadIdx.x; i < n; i += 256) sum += partials[i];
  s[threadIdx.x] = sum;
  __syncthreads();
  for (int width = 128; width > 0; width /= 2) {
    if (threadIdx.x < width) s[threadIdx.x] += s[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = s[0];
}

__global__ void fill_bf16(std::uint16_t* out, std::int64_t n, std::uint64_t key) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v =
        stored_value<GradientMode::normal, Dtype::bf16>(key, static_cast<std::uint64_t>(i));
    out[i] = static_cast<std::uint16_t>(__float_as_uint(v) >> 16);  // exact: v is a bf16 value
  }
}

// ---- Running one variant
// -------------------------------------------------------------------------

struct Variant {
  const char* name;
  void (*kernel)(const Piece*, int, double*);
};
const Variant kVariants[] = {
    {"ldg.16B x4", sumsq_bf16<4, false>},
    {"ldg.16B x8", sumsq_bf16<8, false>},
    {"ldcs.16B x4", sumsq_bf16<4, true>},
    {"ldcs.16B x8", sumsq_bf16<8, true>},
};

class MultiTensorSum {
 public:
  MultiTensorSum(const std::uint16_t* base, const std::vector<std::int64_t>& sizes, int grid)
      : grid_(grid) {
    std::vector<Piece> pieces;
    std::int64_t offset = 0;
    for (std::int64_t n : sizes) {
      for (std::int64_t at = 0; at < n; at += kPiece)
        pieces.push_back(Piece{base + offset + at, std::min(kPiece, n - at)});
      offset += n;
    }
    n_pieces_ = static_cast<int>(pieces.size());
    TALLY_CUDA_CHECK(cudaMalloc(&pieces_, std::max<std::size_t>(pieces.size(), 1) * sizeof(Piece)));
    TALLY_CUDA_CHECK(
        cudaMemcpy(pieces_, pieces.data(), pieces.size() * sizeof(Piece), cudaMemcpyHostToDevice));
    TALLY_CUDA_CHECK(cudaMalloc(&partials_, static_cast<std::size_t>(grid) * sizeof(double)));
    TALLY_CUDA_CHECK(cudaMalloc(&result_, sizeof(double)));
  }
  ~MultiTensorSum() {
    cudaFree(pieces_);
    cudaFree(partials_);
    cudaFree(result_);
  }
  int pieces() const { return n_pieces_; }
  void launch(const Variant& v) const {
    v.kernel<<<grid_, kBlock>>>(pieces_, n_pieces_, partials_);
    add_partials<<<1, 256>>>(partials_, grid_, result_);
  }
  double result() const {
    double r = 0;
    TALLY_CUDA_CHECK(cudaMemcpy(&r, result_, sizeof r, cudaMemcpyDeviceToHost));
    return r;
  }

 private:
  int grid_;
  int n_pieces_ = 0;
  Piece* pieces_ = nullptr;
  double* partials_ = nullptr;
  double* result_ = nullptr;
};

template <class F>
double median_ms(int reps, F&& run) {
  cudaEvent_t start, stop;
  TALLY_CUDA_CHECK(cudaEventCreate(&start));
  TALLY_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) run();
  TALLY_CUDA_CHECK(cudaGetLastError());
  TALLY_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    TALLY_CUDA_CHECK(cudaEventRecord(start));
    run();
    TALLY_CUDA_CHECK(cudaEventRecord(stop));
    TALLY_CUDA_CHECK(cudaEventSynchronize(stop));
    TALLY_CUDA_CHECK(cudaGetLastError());
    float t = 0;
    TALLY_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// fp32 per-thread chains: a block takes at most ceil(pieces / grid) pieces, a thread at most
// kPiece / kBlock elements of each (plus a head or tail element), so a term passes through at most
// that many additions, 2 more (the 4-way split), 5 (warp) and 4 (block) in fp32, plus the square's
// rounding, then the fp64 additions of the partials. Sums of nonnegative terms: Higham Lemma 3.1.
double read_bound(int pieces, int grid) {
  const double per_thread =
      std::ceil(static_cast<double>(pieces) / grid) * (static_cast<double>(kPiece) / kBlock + 2);
  const double k = per_thread + 2 + 5 + 4 + 1;
  return k * 0x1p-24 / (1 - k * 0x1p-24) + (grid + 8) * 0x1p-53;
}

int grid_for(const Variant& v, int sms) {
  int per_sm = 0;
  TALLY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.kernel, kBlock, 0));
  return std::max(per_sm, 1) * sms;
}

// Odd sizes packed back to back (so most tensors start off 16 bytes) against a host fp64 sum.
bool self_check(int sms) {
  std::mt19937_64 rng(12345);
  std::vector<std::int64_t> sizes;
  std::int64_t total = 0;
  for (int i = 0; i < 700; ++i) {
    const std::int64_t n =
        (i % 7 == 0) ? 0 : static_cast<std::int64_t>(rng() % (i % 5 == 0 ? 200000 : 3000));
    sizes.push_back(n);
    total += n;
  }
  std::vector<std::uint16_t> host(static_cast<std::size_t>(total) + 1);
  double want = 0;
  for (std::size_t i = 0; i < host.size(); ++i) {
    const float v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 256.0f;
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    host[i] = static_cast<std::uint16_t>(bits >> 16);  // truncation: still some bf16 value
    if (i >= 1) {
      const std::uint32_t b = static_cast<std::uint32_t>(host[i]) << 16;
      float x;
      std::memcpy(&x, &b, 4);
      want += static_cast<double>(x) * x;
    }
  }
  std::uint16_t* buffer = nullptr;
  TALLY_CUDA_CHECK(cudaMalloc(&buffer, host.size() * 2));
  TALLY_CUDA_CHECK(cudaMemcpy(buffer, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  bool ok = true;
  for (const Variant& v : kVariants) {
    const int grid = grid_for(v, sms);
    MultiTensorSum sum(buffer + 1, sizes, grid);  // + 1: the whole list starts 2 bytes off
    sum.launch(v);
    TALLY_CUDA_CHECK(cudaGetLastError());
    const double got = sum.result();
    const double rel = std::fabs(got - want) / want, bound = read_bound(sum.pieces(), grid);
    std::printf(
        "self-check %-12s %zu tensors, %lld elements, misaligned: rel. error %.3g (bound %.3g) "
        "%s\n",
        v.name, sizes.size(), static_cast<long long>(total), rel, bound,
        rel <= bound ? "ok" : "FAILED");
    ok = ok && rel <= bound;
  }
  cudaFree(buffer);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int log2 = 30, reps = 20;
  bool skip_stats = false;
  std::string sizes_out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--log2" && i + 1 < argc)
      log2 = std::atoi(argv[++i]);
    else if (arg == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (arg == "--sizes-out" && i + 1 < argc)
      sizes_out = argv[++i];
    else if (arg == "--skip-stats")
      skip_stats = true;
    else {
      std::fprintf(stderr,
                   "gpu_norm_bench: unknown argument '%s'\nusage: gpu_norm_bench [--log2 N] "
                   "[--reps N] [--sizes-out FILE] [--skip-stats]\n",
                   arg.c_str());
      return 2;
    }
  }
  if (log2 < 10 || log2 > 34 || reps < 1) {
    std::fprintf(stderr, "gpu_norm_bench: --log2 must be in [10, 34] and --reps >= 1\n");
    return 2;
  }
  try {
    std::string why;
    if (!cuda_device_available(&why)) {
      std::fprintf(stderr, "gpu_norm_bench: no CUDA device: %s\n", why.c_str());
      return 3;
    }
    int device = 0;
    TALLY_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp props;
    TALLY_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
    const int sms = props.multiProcessorCount;
    std::printf("device %d: %s, %d SMs, L2 %d MiB, %.1f GiB\n", device, props.name, sms,
                props.l2CacheSize >> 20, static_cast<double>(props.totalGlobalMem) / (1 << 30));
    if (!self_check(sms)) {
      std::fprintf(stderr, "gpu_norm_bench: the self-check failed\n");
      return 1;
    }

    const std::int64_t total = std::int64_t{1} << log2;
    const std::vector<Tensor> tensors = qwen3_moe_rank(total);
    std::vector<std::int64_t> sizes;
    std::int64_t smallest = total, largest = 0;
    for (const Tensor& t : tensors) {
      sizes.push_back(t.numel);
      smallest = std::min(smallest, t.numel);
      largest = std::max(largest, t.numel);
    }
    std::printf(
        "layout: Qwen3-30B-A3B rank shards (TP=ETP=4, EP=2): %zu tensors, %lld bf16 "
        "elements (2^%d), sizes %lld..%lld\n",
        tensors.size(), static_cast<long long>(total), log2, static_cast<long long>(smallest),
        static_cast<long long>(largest));
    if (!sizes_out.empty()) {
      std::ofstream out(sizes_out);
      for (const Tensor& t : tensors) out << t.name << " " << t.numel << "\n";
      if (!out) {
        std::fprintf(stderr, "gpu_norm_bench: cannot write %s\n", sizes_out.c_str());
        return 2;
      }
    }

    const std::size_t bytes = static_cast<std::size_t>(total) * 2;
    std::uint16_t *src = nullptr, *dst = nullptr;
    TALLY_CUDA_CHECK(cudaMalloc(&src, bytes));
    TALLY_CUDA_CHECK(cudaMalloc(&dst, bytes));
    const GeneratorSpec gen{2026, GradientMode::normal, Dtype::bf16};
    {
      std::int64_t offset = 0;
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        fill_bf16<<<1024, 256>>>(src + offset, tensors[t].numel, stream_key(gen.seed, t));
        offset += tensors[t].numel;
      }
      TALLY_CUDA_CHECK(cudaGetLastError());
      TALLY_CUDA_CHECK(cudaDeviceSynchronize());
    }

    const double copy_ms = median_ms(reps, [&] {
      TALLY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    });
    const double copy_bw = 2.0 * static_cast<double>(bytes) / (copy_ms * 1e-3);
    std::printf("copy: cudaMemcpy D2D %.2f GiB: %.3f ms, %.1f GB/s (read + write)\n",
                static_cast<double>(bytes) / (1 << 30), copy_ms, copy_bw * 1e-9);

    // The reference: local_stats_cuda's fp64 sum of the same generated values.
    std::vector<ShardDesc> shards;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const Tensor& x = tensors[t];
      std::vector<std::int64_t> shape = {x.rows};
      if (x.cols) shape.push_back(x.cols);
      ShardDesc s = whole_tensor(t, shape);
      if (x.numel < box_numel(s)) s.range = ElementRange{0, x.numel};
      shards.push_back(s);
    }
    StatsOptions f64;
    const double reference = local_stats_cuda(shards, gen, f64).total.sum_squares;

    std::printf("\n%-14s %8s %10s %12s %10s %12s %10s\n", "read kernel", "grid", "pieces",
                "median ms", "GB/s", "% of copy", "rel. err");
    double best_bw = 0;
    const char* best = "";
    bool ok = true;
    for (const Variant& v : kVariants) {
      const int grid = grid_for(v, sms);
      MultiTensorSum sum(src, sizes, grid);
      const double ms = median_ms(reps, [&] { sum.launch(v); });
      const double got = sum.result();
      sum.launch(v);
      const double again = sum.result();
      const double bw = static_cast<double>(bytes) / (ms * 1e-3);
      const double rel = std::fabs(got - reference) / reference;
      const bool good = rel <= read_bound(sum.pieces(), grid) && got == again;
      ok = ok && good;
      std::printf("%-14s %8d %10d %12.4f %10.1f %11.1f%% %10.2e%s\n", v.name, grid, sum.pieces(),
                  ms, bw * 1e-9, 100.0 * bw / copy_bw, rel,
                  good ? "" : (got != again ? "  NOT DETERMINISTIC" : "  OUT OF BOUND"));
      if (bw > best_bw) {
        best_bw = bw;
        best = v.name;
      }
    }
    std::printf("best: %s at %.1f GB/s = %.1f%% of the copy bandwidth (target >= 85%%)\n", best,
                best_bw * 1e-9, 100.0 * best_bw / copy_bw);
    std::printf("sum of squares %.17g (local_stats_cuda fp64 reference %.17g)\n", reference,
                reference);

    if (!skip_stats) {
      // local_stats_cuda on the same shards: values generated on the device, no buffer read. Wall
      // clock per call (descriptor and work-list copy, two launches, result copy), median of 5.
      std::printf("\n%-34s %12s %14s\n", "local_stats_cuda (generated)", "median ms", "elements/s");
      struct Case {
        GradientMode mode;
        Accumulation acc;
      };
      for (Case c : {Case{GradientMode::ones, Accumulation::fp32},
                     Case{GradientMode::rank_encoded, Accumulation::fp64},
                     Case{GradientMode::normal, Accumulation::fp32},
                     Case{GradientMode::normal, Accumulation::fp64}}) {
        StatsOptions options;
        options.accumulation = c.acc;
        const GeneratorSpec g{gen.seed, c.mode, Dtype::bf16};
        std::vector<double> ms;
        local_stats_cuda(shards, g, options);
        for (int i = 0; i < 5; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          local_stats_cuda(shards, g, options);
          ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
        }
        std::sort(ms.begin(), ms.end());
        const std::string label = std::string(mode_name(c.mode)) + " bf16, " +
                                  std::string(accumulation_name(c.acc)) + " acc";
        std::printf("%-34s %12.3f %14.3e\n", label.c_str(), ms[2],
                    static_cast<double>(total) / (ms[2] * 1e-3));
      }
    }
    cudaFree(src);
    cudaFree(dst);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_norm_bench: %s\n", e.what());
    return 3;
  }
}
