// CUDA twins of local_stats_cpu and clip_scale_cpu. The contract, the order of every sum and the
// launch structure are documented in kernels/local_stats_cuda.h. Compiled with --fmad=false, and
// every product and sum below is an explicitly rounded intrinsic as well, so no FMA contraction
// can change a rounding (the CPU build compiles local_stats.cpp with -ffp-contract=off).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/detail/cuda_check.h"
#include "kernels/local_stats_cuda.h"

namespace tally::kernels {
namespace {

static_assert(kStatsLanes == 8, "the butterfly below is written for 8 lanes");
static_assert(kStatsChunk % kStatsLanes == 0, "chunks must start at lane 0");
static_assert(kMaxDims == 4, "the cursor below is written for 4 dimensions");

constexpr int kThreads = 256;                            // per block, both passes
constexpr int kChunksPerBlock = kThreads / kStatsLanes;  // chunk pass: 8 threads per chunk
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// ---- Device descriptors (host-built, one copy per call) ----------------------------------------

// A shard with its box padded to 4 dimensions by leading dimensions of size 1.
struct DeviceShard {
  std::uint64_t key = 0;        // stream_key(seed, param_id)
  std::int64_t extent[4] = {};  // the box's extent per dimension
  std::int64_t stride[4] = {};  // the logical tensor's row-major strides
  std::int64_t jump[3] = {};    // logical-index change when dimension d + 1 wraps into d
  std::int64_t base = 0;        // logical index of the box's first element
  std::int64_t begin = 0;       // first visited position in the box's row-major order
  std::int64_t count = 0;       // visited elements
  std::int64_t first_item = 0;  // its first chunk in the work list
  std::int64_t chunks = 0;      // ceil(count / kStatsChunk)
  std::int64_t out_offset = 0;  // clip_scale: where its values start in the output
};

struct WorkItem {
  std::int64_t chunk = 0;  // chunk index within the shard
  std::int32_t shard = 0;
  std::int32_t unused = 0;
};

// One additive statistic: the square, |g|^p by repeated multiplication (integer p in [1, 8]),
// or pow(|g|, p).
enum class TermKind : std::int32_t { square, integer_power, power };
struct StatTerm {
  double p = 0;  // for fp32 accumulation: p rounded to float, as local_stats_cpu does
  std::int32_t integer_p = 0;
  TermKind kind = TermKind::square;
};

// ---- Rounded arithmetic in the accumulation type ------------------------------------------------

template <class A>
struct Arith;
template <>
struct Arith<float> {
  __device__ static float add(float a, float b) { return __fadd_rn(a, b); }
  __device__ static float mul(float a, float b) { return __fmul_rn(a, b); }
  __device__ static float abs(float a) { return fabsf(a); }
  // local_stats_cpu calls powf; here CUDA's double pow of the widened operands, rounded once.
  __device__ static float power(float a, double p) {
    return __double2float_rn(::pow(static_cast<double>(a), p));
  }
};
template <>
struct Arith<double> {
  __device__ static double add(double a, double b) { return __dadd_rn(a, b); }
  __device__ static double mul(double a, double b) { return __dmul_rn(a, b); }
  __device__ static double abs(double a) { return fabs(a); }
  __device__ static double power(double a, double p) { return ::pow(a, p); }
};

// ---- Walking a box in row-major order -----------------------------------------------------------

struct Cursor {
  std::int64_t c[4];
  std::int64_t logical;

  // Position r of the box's row-major order (0 <= r < the box's size).
  __device__ void seek(const DeviceShard& s, std::int64_t r) {
    logical = s.base;
#pragma unroll
    for (int d = 3; d > 0; --d) {
      c[d] = r % s.extent[d];
      r /= s.extent[d];
      logical += c[d] * s.stride[d];
    }
    c[0] = r;
    logical += r * s.stride[0];
  }

  // k positions further; the new position must be inside the box.
  __device__ void advance(const DeviceShard& s, std::int64_t k) {
    c[3] += k;
    logical += k;
    while (c[3] >= s.extent[3]) {
      c[3] -= s.extent[3];
      ++c[2];
      logical += s.jump[2];
    }
    while (c[2] >= s.extent[2]) {
      c[2] -= s.extent[2];
      ++c[1];
      logical += s.jump[1];
    }
    while (c[1] >= s.extent[1]) {
      c[1] -= s.extent[1];
      ++c[0];
      logical += s.jump[0];
    }
  }
};

// ---- Pass 1: one group of 8 threads per (shard, chunk, statistic) -------------------------------

// Lane `lane`'s sum of term(g) over the chunk's elements v = lane, lane + 8, ... < len, in
// increasing v, from +0; with kExtras also its abs-max and zero count.
template <GradientMode M, Dtype D, class A, bool kExtras, class Term>
__device__ void lane_pass(const DeviceShard& s, std::int64_t chunk_first, std::int64_t len,
                          int lane, Term term, A& sum, float& amax, std::uint32_t& zeros) {
  if (lane >= len) return;
  Cursor cursor;
  cursor.seek(s, s.begin + chunk_first + lane);
  for (std::int64_t v = lane;;) {
    const float g = stored_value<M, D>(s.key, static_cast<std::uint64_t>(cursor.logical));
    sum = Arith<A>::add(sum, term(static_cast<A>(g)));
    if constexpr (kExtras) {
      const float magnitude = fabsf(g);
      amax = magnitude > amax ? magnitude : amax;  // NaN never wins
      zeros += g == 0.0f ? 1u : 0u;
    }
    v += kStatsLanes;
    if (v >= len) break;
    cursor.advance(s, kStatsLanes);
  }
}

template <GradientMode M, Dtype D, class A>
__global__ void __launch_bounds__(kThreads)
    chunk_pass(const DeviceShard* __restrict__ shards, const WorkItem* __restrict__ items,
               std::int64_t n_items, const StatTerm* __restrict__ terms, A* __restrict__ chunk_sums,
               float* __restrict__ chunk_max, std::uint32_t* __restrict__ chunk_zeros) {
  const std::int64_t item =
      static_cast<std::int64_t>(blockIdx.x) * kChunksPerBlock + threadIdx.x / kStatsLanes;
  const int lane = static_cast<int>(threadIdx.x % kStatsLanes);
  const int stat = static_cast<int>(blockIdx.y);
  A sum = A(0);
  float amax = 0.0f;
  std::uint32_t zeros = 0;
  if (item < n_items) {
    const WorkItem work = items[item];
    const DeviceShard s = shards[work.shard];
    const std::int64_t first = work.chunk * kStatsChunk;
    const std::int64_t len = s.count - first < kStatsChunk ? s.count - first : kStatsChunk;
    const StatTerm t = terms[stat];
    if (t.kind == TermKind::square) {
      lane_pass<M, D, A, true>(
          s, first, len, lane, [](A a) { return Arith<A>::mul(a, a); }, sum, amax, zeros);
    } else if (t.kind == TermKind::integer_power) {
      const int p = t.integer_p;
      lane_pass<M, D, A, false>(
          s, first, len, lane,
          [p](A a) {
            a = Arith<A>::abs(a);
            A result = a;
            for (int k = 1; k < p; ++k) result = Arith<A>::mul(result, a);
            return result;
          },
          sum, amax, zeros);
    } else {
      const double p = t.p;
      lane_pass<M, D, A, false>(
          s, first, len, lane, [p](A a) { return Arith<A>::power(Arith<A>::abs(a), p); }, sum, amax,
          zeros);
    }
  }
  // ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): the xor-1 step pairs (l0, l1), ...; the
  // xor-2 step pairs (l0 + l1, l2 + l3), ...; the xor-4 step pairs the two halves. Addition is
  // commutative bit for bit, so lane 0 ends with exactly the documented tree. Every thread of the
  // warp takes part (groups past the work list carry +0 and write nothing).
#pragma unroll
  for (int width = 1; width < kStatsLanes; width *= 2) {
    sum = Arith<A>::add(sum, __shfl_xor_sync(kFullMask, sum, width));
    const float other_max = __shfl_xor_sync(kFullMask, amax, width);
    amax = other_max > amax ? other_max : amax;
    zeros += __shfl_xor_sync(kFullMask, zeros, width);
  }
  if (item < n_items && lane == 0) {
    chunk_sums[static_cast<std::int64_t>(stat) * n_items + item] = sum;
    if (stat == 0) {
      chunk_max[item] = amax;
      chunk_zeros[item] = zeros;
    }
  }
}

// ---- Pass 2: one thread per (shard, statistic) adds the chunk sums in chunk order --------------

template <class A>
__global__ void __launch_bounds__(kThreads)
    shard_pass(const DeviceShard* __restrict__ shards, std::int64_t n_shards, int n_stats,
               std::int64_t n_items, const A* __restrict__ chunk_sums,
               const float* __restrict__ chunk_max, const std::uint32_t* __restrict__ chunk_zeros,
               A* __restrict__ shard_sums, float* __restrict__ shard_max,
               std::int64_t* __restrict__ shard_zeros) {
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= n_shards * n_stats) return;
  const std::int64_t stat = index / n_shards;
  const std::int64_t shard = index % n_shards;
  const std::int64_t first = shards[shard].first_item;
  const std::int64_t chunks = shards[shard].chunks;
  const A* sums = chunk_sums + stat * n_items + first;
  A sum = A(0);
#pragma unroll 8
  for (std::int64_t c = 0; c < chunks; ++c) sum = Arith<A>::add(sum, sums[c]);
  shard_sums[index] = sum;  // [stat][shard]
  if (stat == 0) {
    float amax = 0.0f;
    std::int64_t zeros = 0;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const float m = chunk_max[first + c];
      amax = m > amax ? m : amax;
      zeros += chunk_zeros[first + c];
    }
    shard_max[shard] = amax;
    shard_zeros[shard] = zeros;
  }
}

// ---- Clip scale: one block per (shard, chunk), one thread per element ---------------------------

template <GradientMode M, Dtype D>
__global__ void __launch_bounds__(kThreads)
    clip_pass(const DeviceShard* __restrict__ shards, const WorkItem* __restrict__ items,
              float coefficient, int store, Dtype storage, float* __restrict__ out) {
  const WorkItem work = items[blockIdx.x];
  const DeviceShard s = shards[work.shard];
  const std::int64_t first = work.chunk * kStatsChunk;
  const std::int64_t len = s.count - first < kStatsChunk ? s.count - first : kStatsChunk;
  for (std::int64_t j = threadIdx.x; j < len; j += kThreads) {
    Cursor cursor;
    cursor.seek(s, s.begin + first + j);
    const float g = stored_value<M, D>(s.key, static_cast<std::uint64_t>(cursor.logical));
    out[s.out_offset + first + j] =
        store != 0 ? apply_clip(g, coefficient, storage) : apply_clip(g, coefficient);
  }
}

// ---- Host side ----------------------------------------------------------------------------------

struct Prepared {
  std::vector<DeviceShard> shards;
  std::vector<WorkItem> items;
  std::int64_t visited = 0;
};

// Validates (as local_stats_cpu does) and builds the descriptors and the (shard, chunk) work list.
Prepared prepare(std::span<const ShardDesc> shards, const GeneratorSpec& gen, const char* caller) {
  if (shards.size() > static_cast<std::size_t>(INT32_MAX))
    throw std::invalid_argument(std::string(caller) + ": more than 2^31 - 1 shards");
  if (states_values(gen))
    throw std::invalid_argument(std::string(caller) +
                                ": stated gradient values (a constant, a scale or a list) are "
                                "computed on the CPU; the path never sends them here");
  Prepared prep;
  prep.shards.reserve(shards.size());
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const ShardDesc& shard = shards[i];
    if (auto error = check_shard(shard))
      throw std::invalid_argument(std::string(caller) + ": shard " + std::to_string(i) +
                                  " (param " + std::to_string(shard.param_id) + "): " + *error);
    DeviceShard d;
    d.key = stream_key(gen.seed, shard.param_id);
    std::int64_t shape[4] = {1, 1, 1, 1}, offset[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4; ++k) d.extent[k] = 1;
    const int pad = kMaxDims - shard.ndim;
    for (int k = 0; k < shard.ndim; ++k) {
      shape[pad + k] = shard.shape[k];
      offset[pad + k] = shard.offset[k];
      d.extent[pad + k] = shard.extent[k];
    }
    d.stride[3] = 1;
    for (int k = 2; k >= 0; --k) d.stride[k] = d.stride[k + 1] * shape[k + 1];
    for (int k = 0; k < 3; ++k) d.jump[k] = d.stride[k] - d.extent[k + 1] * d.stride[k + 1];
    for (int k = 0; k < 4; ++k) d.base += offset[k] * d.stride[k];
    d.begin = shard.range ? shard.range->begin : 0;
    d.count = visited_numel(shard);
    d.first_item = static_cast<std::int64_t>(prep.items.size());
    d.chunks = (d.count + kStatsChunk - 1) / kStatsChunk;
    d.out_offset = prep.visited;
    prep.visited += d.count;
    if (static_cast<std::int64_t>(prep.items.size()) + d.chunks > INT32_MAX)
      throw std::invalid_argument(std::string(caller) + ": more than 2^31 - 1 chunks of " +
                                  std::to_string(kStatsChunk) + " elements in one call");
    for (std::int64_t c = 0; c < d.chunks; ++c)
      prep.items.push_back(WorkItem{c, static_cast<std::int32_t>(i), 0});
    prep.shards.push_back(d);
  }
  return prep;
}

// Byte offsets of the regions of one device allocation, each aligned to 256 bytes.
class Layout {
 public:
  std::size_t add(std::size_t bytes) {
    const std::size_t at = size_;
    size_ += (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
    return at;
  }
  std::size_t size() const { return size_; }

 private:
  std::size_t size_ = 0;
};

class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes) { TALLY_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); }
  ~DeviceMemory() { cudaFree(ptr_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <class T>
  T* at(std::size_t offset) const {
    return reinterpret_cast<T*>(static_cast<std::byte*>(ptr_) + offset);
  }

 private:
  void* ptr_ = nullptr;
};

template <class T>
void stage(std::vector<std::byte>& blob, std::size_t offset, const std::vector<T>& values) {
  if (!values.empty()) std::memcpy(blob.data() + offset, values.data(), values.size() * sizeof(T));
}

struct ChunkArgs {
  const DeviceShard* shards;
  const WorkItem* items;
  std::int64_t n_items;
  const StatTerm* terms;
  void* chunk_sums;
  float* chunk_max;
  std::uint32_t* chunk_zeros;
};

template <GradientMode M, Dtype D, class A>
void launch_chunk_pass_typed(dim3 grid, const ChunkArgs& a) {
  chunk_pass<M, D, A><<<grid, kThreads>>>(a.shards, a.items, a.n_items, a.terms,
                                          static_cast<A*>(a.chunk_sums), a.chunk_max,
                                          a.chunk_zeros);
}

// Exact modes never round to the dtype (stored_value skips it): one instantiation serves all.
template <GradientMode M, class A>
void launch_chunk_pass_mode(Dtype dtype, dim3 grid, const ChunkArgs& a) {
  if constexpr (mode_is_exact(M)) {
    launch_chunk_pass_typed<M, Dtype::fp32, A>(grid, a);
  } else {
    switch (dtype) {
      case Dtype::fp32:
        return launch_chunk_pass_typed<M, Dtype::fp32, A>(grid, a);
      case Dtype::bf16:
        return launch_chunk_pass_typed<M, Dtype::bf16, A>(grid, a);
      case Dtype::fp16:
        return launch_chunk_pass_typed<M, Dtype::fp16, A>(grid, a);
    }
    throw std::invalid_argument("local_stats_cuda: unknown dtype");
  }
}

template <class A>
void launch_chunk_pass(const GeneratorSpec& gen, dim3 grid, const ChunkArgs& a) {
  switch (gen.mode) {
    case GradientMode::ones:
      return launch_chunk_pass_mode<GradientMode::ones, A>(gen.dtype, grid, a);
    case GradientMode::zeros:
      return launch_chunk_pass_mode<GradientMode::zeros, A>(gen.dtype, grid, a);
    case GradientMode::dyadic:
      return launch_chunk_pass_mode<GradientMode::dyadic, A>(gen.dtype, grid, a);
    case GradientMode::uniform:
      return launch_chunk_pass_mode<GradientMode::uniform, A>(gen.dtype, grid, a);
    case GradientMode::normal:
      return launch_chunk_pass_mode<GradientMode::normal, A>(gen.dtype, grid, a);
    case GradientMode::sparse:
      return launch_chunk_pass_mode<GradientMode::sparse, A>(gen.dtype, grid, a);
    case GradientMode::rank_encoded:
      return launch_chunk_pass_mode<GradientMode::rank_encoded, A>(gen.dtype, grid, a);
  }
  throw std::invalid_argument("local_stats_cuda: unknown gradient mode");
}

template <class A>
LocalStats run_stats(std::span<const ShardDesc> input, const GeneratorSpec& gen,
                     const StatsOptions& options) {
  const std::size_t np = options.p_values.size();
  LocalStats result;
  result.total.p_sums.assign(np, 0.0);
  const Prepared prep = prepare(input, gen, "local_stats_cuda");
  for (double p : options.p_values)
    if (!(std::isfinite(p) && p > 0.0))
      throw std::invalid_argument("local_stats_cuda: p = " + std::to_string(p) +
                                  " is not finite and > 0");
  if (np + 1 > 65535) throw std::invalid_argument("local_stats_cuda: more than 65534 p-values");
  if (prep.shards.empty()) return result;

  std::vector<StatTerm> terms(np + 1);
  for (std::size_t i = 0; i < np; ++i) {
    const double p = options.p_values[i];
    StatTerm& t = terms[i + 1];
    t.p = static_cast<double>(static_cast<A>(p));
    if (p == std::floor(p) && p >= 1.0 && p <= 8.0) {
      t.kind = TermKind::integer_power;
      t.integer_p = static_cast<std::int32_t>(p);
    } else {
      t.kind = TermKind::power;
    }
  }

  const auto n_shards = static_cast<std::int64_t>(prep.shards.size());
  const auto n_items = static_cast<std::int64_t>(prep.items.size());
  const auto n_stats = static_cast<std::int64_t>(np + 1);
  Layout in;
  const std::size_t at_shards = in.add(prep.shards.size() * sizeof(DeviceShard));
  const std::size_t at_items = in.add(prep.items.size() * sizeof(WorkItem));
  const std::size_t at_terms = in.add(terms.size() * sizeof(StatTerm));
  Layout out;
  const std::size_t at_shard_sums =
      out.add(static_cast<std::size_t>(n_stats * n_shards) * sizeof(A));
  const std::size_t at_shard_max = out.add(static_cast<std::size_t>(n_shards) * sizeof(float));
  const std::size_t at_shard_zeros =
      out.add(static_cast<std::size_t>(n_shards) * sizeof(std::int64_t));
  Layout scratch;
  const std::size_t at_chunk_sums =
      scratch.add(static_cast<std::size_t>(n_stats * n_items) * sizeof(A));
  const std::size_t at_chunk_max = scratch.add(static_cast<std::size_t>(n_items) * sizeof(float));
  const std::size_t at_chunk_zeros =
      scratch.add(static_cast<std::size_t>(n_items) * sizeof(std::uint32_t));

  std::vector<std::byte> blob(in.size());
  stage(blob, at_shards, prep.shards);
  stage(blob, at_items, prep.items);
  stage(blob, at_terms, terms);

  DeviceMemory memory(in.size() + out.size() + scratch.size());
  const std::size_t out_base = in.size(), scratch_base = in.size() + out.size();
  TALLY_CUDA_CHECK(
      cudaMemcpy(memory.at<void>(0), blob.data(), blob.size(), cudaMemcpyHostToDevice));

  ChunkArgs args{memory.at<DeviceShard>(at_shards),
                 memory.at<WorkItem>(at_items),
                 n_items,
                 memory.at<StatTerm>(at_terms),
                 memory.at<void>(scratch_base + at_chunk_sums),
                 memory.at<float>(scratch_base + at_chunk_max),
                 memory.at<std::uint32_t>(scratch_base + at_chunk_zeros)};
  if (n_items > 0) {
    const dim3 grid(static_cast<unsigned>((n_items + kChunksPerBlock - 1) / kChunksPerBlock),
                    static_cast<unsigned>(n_stats));
    launch_chunk_pass<A>(gen, grid, args);
    TALLY_CUDA_CHECK(cudaGetLastError());
  }
  const std::int64_t sums = n_shards * n_stats;
  shard_pass<A><<<static_cast<unsigned>((sums + kThreads - 1) / kThreads), kThreads>>>(
      args.shards, n_shards, static_cast<int>(n_stats), n_items,
      static_cast<const A*>(args.chunk_sums), args.chunk_max, args.chunk_zeros,
      memory.at<A>(out_base + at_shard_sums), memory.at<float>(out_base + at_shard_max),
      memory.at<std::int64_t>(out_base + at_shard_zeros));
  TALLY_CUDA_CHECK(cudaGetLastError());

  std::vector<std::byte> host(out.size());
  TALLY_CUDA_CHECK(
      cudaMemcpy(host.data(), memory.at<void>(out_base), host.size(), cudaMemcpyDeviceToHost));
  std::vector<A> shard_sums(static_cast<std::size_t>(sums));
  std::vector<float> shard_max(static_cast<std::size_t>(n_shards));
  std::vector<std::int64_t> shard_zeros(static_cast<std::size_t>(n_shards));
  std::memcpy(shard_sums.data(), host.data() + at_shard_sums, shard_sums.size() * sizeof(A));
  std::memcpy(shard_max.data(), host.data() + at_shard_max, shard_max.size() * sizeof(float));
  std::memcpy(shard_zeros.data(), host.data() + at_shard_zeros,
              shard_zeros.size() * sizeof(std::int64_t));

  // local_stats.h's step 4, as local_stats_cpu does it: shard sums added in input order in A.
  A sum_squares = A(0);
  std::vector<A> p_sums(np, A(0));
  if (options.per_tensor) result.per_tensor.reserve(prep.shards.size());
  for (std::int64_t s = 0; s < n_shards; ++s) {
    Stats shard;
    shard.sum_squares = static_cast<double>(shard_sums[s]);
    shard.abs_max = static_cast<double>(shard_max[s]);
    shard.zeros = shard_zeros[s];
    shard.elements = prep.shards[s].count;
    shard.p_sums.resize(np);
    for (std::size_t i = 0; i < np; ++i)
      shard.p_sums[i] = static_cast<double>(shard_sums[(i + 1) * n_shards + s]);
    sum_squares += shard_sums[s];
    for (std::size_t i = 0; i < np; ++i) p_sums[i] += shard_sums[(i + 1) * n_shards + s];
    result.total.abs_max = std::max(result.total.abs_max, shard.abs_max);
    result.total.zeros += shard.zeros;
    result.total.elements += shard.elements;
    if (options.per_tensor) result.per_tensor.push_back(std::move(shard));
  }
  result.total.sum_squares = static_cast<double>(sum_squares);
  for (std::size_t i = 0; i < np; ++i) result.total.p_sums[i] = static_cast<double>(p_sums[i]);
  return result;
}

template <GradientMode M, Dtype D>
void launch_clip_pass_typed(unsigned blocks, const DeviceShard* shards, const WorkItem* items,
                            const ClipSpec& clip, float* out) {
  clip_pass<M, D><<<blocks, kThreads>>>(shards, items, clip.coefficient, clip.store_as ? 1 : 0,
                                        clip.store_as.value_or(Dtype::fp32), out);
}

template <GradientMode M>
void launch_clip_pass(Dtype dtype, unsigned blocks, const DeviceShard* shards,
                      const WorkItem* items, const ClipSpec& clip, float* out) {
  if constexpr (mode_is_exact(M)) {
    launch_clip_pass_typed<M, Dtype::fp32>(blocks, shards, items, clip, out);
  } else {
    switch (dtype) {
      case Dtype::fp32:
        return launch_clip_pass_typed<M, Dtype::fp32>(blocks, shards, items, clip, out);
      case Dtype::bf16:
        return launch_clip_pass_typed<M, Dtype::bf16>(blocks, shards, items, clip, out);
      case Dtype::fp16:
        return launch_clip_pass_typed<M, Dtype::fp16>(blocks, shards, items, clip, out);
    }
    throw std::invalid_argument("clip_scale_cuda: unknown dtype");
  }
}

}  // namespace

bool cuda_device_available(std::string* why) {
  const auto fail = [why](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess)
    return fail("cudaGetDeviceCount failed: " + detail::cuda_error_text(status));
  if (count == 0) return fail("cudaGetDeviceCount found no CUDA device");
  int device = 0;
  status = cudaGetDevice(&device);
  if (status != cudaSuccess)
    return fail("cudaGetDevice failed: " + detail::cuda_error_text(status));
  // A kernel image for this device must exist (the build's CMAKE_CUDA_ARCHITECTURES).
  cudaFuncAttributes attributes;
  status = cudaFuncGetAttributes(&attributes, chunk_pass<GradientMode::ones, Dtype::fp32, double>);
  if (status != cudaSuccess) {
    cudaDeviceProp props;
    std::string name = "?";
    if (cudaGetDeviceProperties(&props, device) == cudaSuccess)
      name = std::string(props.name) + ", compute capability " + std::to_string(props.major) + "." +
             std::to_string(props.minor);
    cudaGetLastError();  // clear the non-sticky error
    return fail("device " + std::to_string(device) + " (" + name +
                ") cannot run tally's kernels: " + detail::cuda_error_text(status));
  }
  return true;
}

LocalStats local_stats_cuda(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                            const StatsOptions& options) {
  return options.accumulation == Accumulation::fp64 ? run_stats<double>(shards, gen, options)
                                                    : run_stats<float>(shards, gen, options);
}

std::vector<float> clip_scale_cuda(std::span<const ShardDesc> shards, const GeneratorSpec& gen,
                                   const ClipSpec& clip) {
  const Prepared prep = prepare(shards, gen, "clip_scale_cuda");
  std::vector<float> result(static_cast<std::size_t>(prep.visited));
  if (prep.items.empty()) return result;
  Layout layout;
  const std::size_t at_shards = layout.add(prep.shards.size() * sizeof(DeviceShard));
  const std::size_t at_items = layout.add(prep.items.size() * sizeof(WorkItem));
  const std::size_t in_bytes = layout.size();
  const std::size_t at_out = layout.add(result.size() * sizeof(float));
  std::vector<std::byte> blob(in_bytes);
  stage(blob, at_shards, prep.shards);
  stage(blob, at_items, prep.items);
  DeviceMemory memory(layout.size());
  TALLY_CUDA_CHECK(
      cudaMemcpy(memory.at<void>(0), blob.data(), blob.size(), cudaMemcpyHostToDevice));
  const auto blocks = static_cast<unsigned>(prep.items.size());
  const DeviceShard* d_shards = memory.at<DeviceShard>(at_shards);
  const WorkItem* d_items = memory.at<WorkItem>(at_items);
  float* d_out = memory.at<float>(at_out);
  switch (gen.mode) {
    case GradientMode::ones:
      launch_clip_pass<GradientMode::ones>(gen.dtype, blocks, d_shards, d_items, clip, d_out);
      break;
    case GradientMode::zeros:
      launch_clip_pass<GradientMode::zeros>(gen.dtype, blocks, d_shards, d_items, clip, d_out);
      break;
    case GradientMode::dyadic:
      launch_clip_pass<GradientMode::dyadic>(gen.dtype, blocks, d_shards, d_items, clip, d_out);
      break;
    case GradientMode::uniform:
      launch_clip_pass<GradientMode::uniform>(gen.dtype, blocks, d_shards, d_items, clip, d_out);
      break;
    case GradientMode::normal:
      launch_clip_pass<GradientMode::normal>(gen.dtype, blocks, d_shards, d_items, clip, d_out);
      break;
    case GradientMode::sparse:
      launch_clip_pass<GradientMode::sparse>(gen.dtype, blocks, d_shards, d_items, clip, d_out);
      break;
    case GradientMode::rank_encoded:
      launch_clip_pass<GradientMode::rank_encoded>(gen.dtype, blocks, d_shards, d_items, clip,
                                                   d_out);
      break;
    default:
      throw std::invalid_argument("clip_scale_cuda: unknown gradient mode");
  }
  TALLY_CUDA_CHECK(cudaGetLastError());
  TALLY_CUDA_CHECK(
      cudaMemcpy(result.data(), d_out, result.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return result;
}

}  // namespace tally::kernels
