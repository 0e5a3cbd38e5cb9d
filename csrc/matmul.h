// Host-side facts of the kosmos_matmul FFI target that the nanobind module
// exposes (plain C++: module.cc includes it without nvcc).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace kosmos {

// Test hook: how many kosmos_matmul launches each engine ran since the process
// started, as (engine name, count): "sm90_128x256", "sm90_128x128", "portable".
std::vector<std::pair<std::string, long long>> matmul_engine_runs();

}  // namespace kosmos
