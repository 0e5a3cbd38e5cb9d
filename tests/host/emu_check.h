// Shared by the host emulation drivers: a check that records a failure and keeps
// going (so one run reports every broken invariant, not just the first), counted
// atomically because the emulated CTAs are threads.
#pragma once
#include <cstdio>

namespace emu {
inline int g_failures = 0;
}  // namespace emu

#define EMU_CHECK(cond, ...)                                      \
  do {                                                            \
    if (!(cond)) {                                                \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__);            \
      std::printf(__VA_ARGS__);                                   \
      std::printf("\n");                                          \
      __atomic_fetch_add(&emu::g_failures, 1, __ATOMIC_RELAXED);  \
    }                                                             \
  } while (0)
