// The fused CUDA forward of the fixed-code input: writes tiled_code(ids) (megatron_ext/codes.py)
// straight into a fresh [..., hidden] tensor. Bound to Python by binding.cpp; selected by
// megatron_ext/kernels.py.
//
// Every code is affine over GF(2): c = A·bits(id) ⊕ b, passed as the n columns of A and b,
// each an n-bit mask (the binary code is A = I, b = 0). Each block takes a few tokens; one
// thread per token XORs the columns selected by the id's bits, once, and stores the n code
// bits tiled in shared memory; then all threads write the rows with 16-byte stores.

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

constexpr int kMaxBits = 62;              // FixedCode allows 1..62 bits
constexpr int kThreads = 256;
constexpr int kMaxTokensPerBlock = 64;
constexpr int kStoresPerBlock = 1024;     // 16-byte stores a block aims for (4 per thread)

struct AffineCode {
  uint64_t columns[kMaxBits];  // column k of A: bit i set when A[i][k] = 1
  uint64_t offset;             // b: bit i set when b[i] = 1
  int num_bits;
};

// VEC values of the output's bit pattern (uint32_t: fp32; uint16_t: bf16, fp16), one store.
template <typename Bits, int VEC>
struct alignas(sizeof(Bits) * VEC) Pack {
  Bits v[VEC];
};

// Rows [first, first + tokens) of out [num_tokens, hidden]; out[t][j] = code bit (j mod n)
// of ids[t], as `high` (bit 1) or `low` (bit 0). hidden is a multiple of VEC and of n.
template <typename Bits, int VEC>
__global__ void __launch_bounds__(kThreads) tiled_code_kernel(
    const int64_t* __restrict__ ids, Bits* __restrict__ out, const AffineCode code,
    int64_t num_tokens, int hidden, int tokens_per_block, Bits low, Bits high) {
  // Code bits of each token, repeated so that bits [r, r + VEC) lie in one word for r < n.
  __shared__ unsigned __int128 tiled[kMaxTokensPerBlock];
  const int n = code.num_bits;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * tokens_per_block;
  const int tokens = static_cast<int>(min(static_cast<int64_t>(tokens_per_block),
                                          num_tokens - first));
  if (threadIdx.x < tokens) {
    const uint64_t id = static_cast<uint64_t>(ids[first + threadIdx.x]);
    uint64_t c = code.offset;
    for (int k = 0; k < n; ++k) {
      if ((id >> k) & 1) c ^= code.columns[k];
    }
    unsigned __int128 t = 0;
    for (int s = 0; s < n + VEC - 1; s += n) t |= static_cast<unsigned __int128>(c) << s;
    tiled[threadIdx.x] = t;
  }
  __syncthreads();

  const int stores_per_row = hidden / VEC;
  Pack<Bits, VEC>* rows = reinterpret_cast<Pack<Bits, VEC>*>(out + first * hidden);
  for (int i = threadIdx.x; i < tokens * stores_per_row; i += blockDim.x) {
    const int token = i / stores_per_row;
    const int r = ((i - token * stores_per_row) * VEC) % n;  // code bit of the first value
    const uint32_t window = static_cast<uint32_t>(tiled[token] >> r);
    Pack<Bits, VEC> pack;
#pragma unroll
    for (int e = 0; e < VEC; ++e) pack.v[e] = ((window >> e) & 1) ? high : low;
    rows[i] = pack;
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
void launch(const at::Tensor& ids, at::Tensor& out, const AffineCode& code, int hidden,
            float low, float high) {
  constexpr int kVec = 16 / sizeof(Bits);
  const bool vectorised = (hidden % kVec) == 0;  // rows then start on 16-byte boundaries
  const int vec = vectorised ? kVec : 1;
  const int tokens_per_block =
      std::max(1, std::min(kMaxTokensPerBlock, kStoresPerBlock * vec / hidden));
  const int64_t num_tokens = ids.numel();
  const int64_t blocks = (num_tokens + tokens_per_block - 1) / tokens_per_block;
  TORCH_CHECK(blocks <= INT32_MAX, "fixed_code_cuda: too many tokens for one launch");
  const Bits lo = bits_of_value<Bits>(low, out.scalar_type());
  const Bits hi = bits_of_value<Bits>(high, out.scalar_type());
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto* dst = reinterpret_cast<Bits*>(out.data_ptr());
  const int64_t* src = ids.const_data_ptr<int64_t>();
  if (vectorised) {
    tiled_code_kernel<Bits, kVec><<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
        src, dst, code, num_tokens, hidden, tokens_per_block, lo, hi);
  } else {
    tiled_code_kernel<Bits, 1><<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
        src, dst, code, num_tokens, hidden, tokens_per_block, lo, hi);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// ids [...] int64 on a GPU -> [..., hidden_size] in dtype (float32, bfloat16 or float16),
// position j holding code bit (j mod n) as `high` (bit 1) or `low` (bit 0).
at::Tensor fixed_code_cuda(const at::Tensor& ids, int64_t hidden_size, int64_t num_bits,
                           const std::vector<int64_t>& columns, int64_t offset, double low,
                           double high, at::ScalarType dtype) {
  TORCH_CHECK(ids.is_cuda(), "fixed_code_cuda: ids must be on a GPU");
  TORCH_CHECK(ids.scalar_type() == at::kLong, "fixed_code_cuda: ids must be int64");
  TORCH_CHECK(num_bits >= 1 && num_bits <= kMaxBits, "fixed_code_cuda: num_bits in [1, 62]");
  TORCH_CHECK(static_cast<int64_t>(columns.size()) == num_bits,
              "fixed_code_cuda: one column mask per code bit");
  TORCH_CHECK(hidden_size > 0 && hidden_size % num_bits == 0,
              "fixed_code_cuda: hidden_size must be a positive multiple of num_bits");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "fixed_code_cuda: dtype must be float32, bfloat16 or float16");

  AffineCode code{};
  code.num_bits = static_cast<int>(num_bits);
  code.offset = static_cast<uint64_t>(offset);
  for (int k = 0; k < code.num_bits; ++k) code.columns[k] = static_cast<uint64_t>(columns[k]);

  const c10::cuda::CUDAGuard guard(ids.device());
  const at::Tensor flat = ids.contiguous();
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(hidden_size);
  at::Tensor out = at::empty(shape, ids.options().dtype(dtype));
  if (flat.numel() == 0) return out;
  const int hidden = static_cast<int>(hidden_size);
  if (dtype == at::kFloat) {
    launch<uint32_t>(flat, out, code, hidden, static_cast<float>(low), static_cast<float>(high));
  } else {
    launch<uint16_t>(flat, out, code, hidden, static_cast<float>(low), static_cast<float>(high));
  }
  return out;
}
