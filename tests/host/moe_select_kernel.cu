// The MoE routing's selection kernel (kernels/moe/select.cuh) alone as device
// code, for tests/test_host_moe_select.py's sm_90a compile check (no XLA headers
// needed, unlike its FFI handler's translation unit, csrc/moe_select_cuda.cu).
#include "moe/select.cuh"
