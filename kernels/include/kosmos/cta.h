// CTA-wide helpers shared by the persistent kernels.
#pragma once
#include "kosmos/platform.h"

namespace kosmos {

#ifdef KOSMOS_GPU
// Thread 0 decides, every thread gets the value: the kernels keep their control
// flow CTA-uniform so that every __syncthreads() is reached by all threads.
// `cell` is one int of shared memory owned by the caller.
KOSMOS_DEVICE int cta_bcast(int* cell, int v) {
  if (threadIdx.x == 0) *cell = v;
  __syncthreads();
  const int out = *cell;
  __syncthreads();  // nobody overwrites the cell before every thread read it
  return out;
}
#endif

}  // namespace kosmos
