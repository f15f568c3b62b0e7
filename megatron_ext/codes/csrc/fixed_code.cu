// The fused CUDA forward of the fixed-code input, one kernel for every scheme and tiling: writes
// FixedCode.encode(ids) (megatron_ext/codes.py) straight into a fresh [..., hidden] tensor.
// Bound to Python by binding.cpp; selected by megatron_ext/kernels.py, which builds its inputs.
//
// Every tiled code is affine over GF(2) in the bits of the code input x (the id, or its entry
// of the code's per-id table), so a row's bits, packed 32 positions to a word (position j: word
// j / 32, bit j % 32), are the XOR of one row per byte of x from `lookup`
// ([chunks, 256, words] 32-bit words; kernels.lookup_tables). Each block takes a few tokens:
// it reads their x, builds their packed rows in shared memory (chunks loads per word, from
// tables that stay in cache), then all threads write the rows with 16-byte stores.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTokensPerBlock = 64;
constexpr int kStoresPerBlock = 1024;     // 16-byte stores a block aims for (4 per thread)
constexpr int kMaxSharedBytes = 48 * 1024;

// VEC values of the output's bit pattern (uint32_t: fp32; uint16_t: bf16, fp16), one store.
template <typename Bits, int VEC>
struct alignas(sizeof(Bits) * VEC) Pack {
  Bits v[VEC];
};

// Rows [first, first + tokens) of out [num_tokens, hidden]: out[t][j] = `high` where bit j of
// row(t) is set, else `low`. hidden is a multiple of VEC, and VEC divides 32.
template <typename Bits, int VEC>
__global__ void __launch_bounds__(kThreads) fixed_code_kernel(
    const int64_t* __restrict__ ids, const int64_t* __restrict__ table, int64_t table_size,
    const uint32_t* __restrict__ lookup, int chunks, int words, Bits* __restrict__ out,
    int64_t num_tokens, int hidden, int tokens_per_block, Bits low, Bits high) {
  extern __shared__ uint32_t rows[];  // [tokens_per_block][words]
  __shared__ uint64_t inputs[kMaxTokensPerBlock];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * tokens_per_block;
  const int tokens = static_cast<int>(min(static_cast<int64_t>(tokens_per_block),
                                          num_tokens - first));
  if (threadIdx.x < tokens) {
    const int64_t id = ids[first + threadIdx.x];
    // Ids outside the vocabulary fail FixedCodeEmbedding's device assert; never read past
    // the table meanwhile.
    const bool inside = id >= 0 && id < table_size;
    inputs[threadIdx.x] = static_cast<uint64_t>(table == nullptr ? id : (inside ? table[id] : 0));
  }
  __syncthreads();

  for (int i = threadIdx.x; i < tokens * words; i += blockDim.x) {
    const int token = i / words;
    const int w = i - token * words;
    const uint64_t x = inputs[token];
    uint32_t word = 0;
    for (int c = 0; c < chunks; ++c) {
      const int byte = static_cast<int>((x >> (8 * c)) & 0xff);
      word ^= __ldg(lookup + (static_cast<int64_t>(c) * 256 + byte) * words + w);
    }
    rows[i] = word;
  }
  __syncthreads();

  const int stores_per_row = hidden / VEC;
  Pack<Bits, VEC>* dst = reinterpret_cast<Pack<Bits, VEC>*>(out + first * hidden);
  for (int i = threadIdx.x; i < tokens * stores_per_row; i += blockDim.x) {
    const int token = i / stores_per_row;
    const int j = (i - token * stores_per_row) * VEC;  // first position of this store
    const uint32_t window = rows[token * words + j / 32] >> (j % 32);
    Pack<Bits, VEC> pack;
#pragma unroll
    for (int e = 0; e < VEC; ++e) pack.v[e] = ((window >> e) & 1) ? high : low;
    dst[i] = pack;
  }
}

template <typename Bits>
Bits bits_of_value(float value, at::ScalarType dtype) {
  Bits bits;
  if (dtype == at::kFloat) {
    std::memcpy(&bits, &value, sizeof(bits));
  } else if (dtype == at::kBFloat16) {
    bits = c10::BFloat16(value).x;
  } else {
    bits = c10::Half(value).x;
  }
  return bits;
}

template <typename Bits>
void launch(const at::Tensor& ids, const at::Tensor& table, const at::Tensor& lookup,
            at::Tensor& out, int hidden, float low, float high) {
  constexpr int kVec = 16 / sizeof(Bits);
  const bool vectorised = (hidden % kVec) == 0;  // rows then start on 16-byte boundaries
  const int vec = vectorised ? kVec : 1;
  const int chunks = static_cast<int>(lookup.size(0));
  const int words = static_cast<int>(lookup.size(2) / 4);
  const int tokens_per_block =
      std::max(1, std::min(kMaxTokensPerBlock, kStoresPerBlock * vec / hidden));
  const size_t shared = static_cast<size_t>(tokens_per_block) * words * sizeof(uint32_t);
  TORCH_CHECK(shared <= kMaxSharedBytes, "fixed_code_cuda: hidden_size too large");
  const int64_t num_tokens = ids.numel();
  const int64_t blocks = (num_tokens + tokens_per_block - 1) / tokens_per_block;
  TORCH_CHECK(blocks <= INT32_MAX, "fixed_code_cuda: too many tokens for one launch");
  const Bits lo = bits_of_value<Bits>(low, out.scalar_type());
  const Bits hi = bits_of_value<Bits>(high, out.scalar_type());
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto* dst = reinterpret_cast<Bits*>(out.data_ptr());
  const int64_t* src = ids.const_data_ptr<int64_t>();
  const int64_t* per_id = table.numel() ? table.const_data_ptr<int64_t>() : nullptr;
  const auto* rows = reinterpret_cast<const uint32_t*>(lookup.const_data_ptr<uint8_t>());
  const auto grid = static_cast<unsigned int>(blocks);
  if (vectorised) {
    fixed_code_kernel<Bits, kVec><<<grid, kThreads, shared, stream>>>(
        src, per_id, table.numel(), rows, chunks, words, dst, num_tokens, hidden,
        tokens_per_block, lo, hi);
  } else {
    fixed_code_kernel<Bits, 1><<<grid, kThreads, shared, stream>>>(
        src, per_id, table.numel(), rows, chunks, words, dst, num_tokens, hidden,
        tokens_per_block, lo, hi);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// ids [...] int64, table [V] int64 or empty, lookup [chunks, 256, 4·⌈hidden/32⌉] uint8, all on
// one GPU -> [..., hidden_size] in dtype (float32, bfloat16 or float16).
at::Tensor fixed_code_cuda(const at::Tensor& ids, const at::Tensor& table,
                           const at::Tensor& lookup, int64_t hidden_size, double low,
                           double high, at::ScalarType dtype) {
  TORCH_CHECK(ids.is_cuda(), "fixed_code_cuda: ids must be on a GPU");
  TORCH_CHECK(ids.scalar_type() == at::kLong, "fixed_code_cuda: ids must be int64");
  TORCH_CHECK(table.scalar_type() == at::kLong && table.dim() == 1 &&
                  (table.numel() == 0 || (table.device() == ids.device() && table.is_contiguous())),
              "fixed_code_cuda: table must be an int64 vector on the ids' GPU, or empty");
  TORCH_CHECK(hidden_size > 0, "fixed_code_cuda: hidden_size must be positive");
  TORCH_CHECK(lookup.scalar_type() == at::kByte && lookup.dim() == 3 && lookup.size(1) == 256 &&
                  lookup.size(0) >= 1 && lookup.size(0) <= 8 &&
                  lookup.size(2) == (hidden_size + 31) / 32 * 4 && lookup.is_contiguous() &&
                  lookup.device() == ids.device(),
              "fixed_code_cuda: lookup must be contiguous uint8 [1..8, 256, 4*ceil(hidden/32)] "
              "on the ids' GPU");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "fixed_code_cuda: dtype must be float32, bfloat16 or float16");

  const c10::cuda::CUDAGuard guard(ids.device());
  const at::Tensor flat = ids.contiguous();
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(hidden_size);
  at::Tensor out = at::empty(shape, ids.options().dtype(dtype));
  if (flat.numel() == 0) return out;
  const int hidden = static_cast<int>(hidden_size);
  if (dtype == at::kFloat) {
    launch<uint32_t>(flat, table, lookup, out, hidden, static_cast<float>(low),
                     static_cast<float>(high));
  } else {
    launch<uint16_t>(flat, table, lookup, out, hidden, static_cast<float>(low),
                     static_cast<float>(high));
  }
  return out;
}
