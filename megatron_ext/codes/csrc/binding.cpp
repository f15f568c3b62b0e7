// Python binding of the fused fixed-code forward (fixed_code.cu), JIT-built by
// megatron_ext/cuda_extension.py.

#include <torch/extension.h>

at::Tensor fixed_code_cuda(const at::Tensor& ids, const at::Tensor& table,
                           const at::Tensor& lookup, int64_t hidden_size, double low,
                           double high, at::ScalarType dtype);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tiled_code", &fixed_code_cuda,
        "ids [...] int64, per-id table [V] int64 (or empty) and lookup tables "
        "[chunks, 256, 4*ceil(hidden/32)] uint8 on a GPU -> fixed code [..., hidden_size] "
        "in dtype",
        py::arg("ids"), py::arg("table"), py::arg("lookup"), py::arg("hidden_size"),
        py::arg("low"), py::arg("high"), py::arg("dtype"));
}
