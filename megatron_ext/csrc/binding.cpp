// Python binding of the fused fixed-code forward (fixed_code.cu), JIT-built by
// megatron_ext/cuda_extension.py.

#include <torch/extension.h>

#include <vector>

at::Tensor fixed_code_cuda(const at::Tensor& ids, int64_t hidden_size, int64_t num_bits,
                           const std::vector<int64_t>& columns, int64_t offset, double low,
                           double high, at::ScalarType dtype);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tiled_code", &fixed_code_cuda,
        "ids [...] int64 on a GPU -> tiled fixed code [..., hidden_size] in dtype",
        py::arg("ids"), py::arg("hidden_size"), py::arg("num_bits"), py::arg("columns"),
        py::arg("offset"), py::arg("low"), py::arg("high"), py::arg("dtype"));
}
