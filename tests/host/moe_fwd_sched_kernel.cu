// Compile check of the MoE schedules as device code, the forward's and the
// backward's build queue (run by
// tests/test_host_moe_fwd_sched.py with nvcc -arch=sm_90a; nothing launches
// it): moe_fwd_cta instantiated over a plain one-thread-per-CTA Ops whose
// control words are the kernel's (queues, counters, epoch flags with bounded
// waits, at the scope of their reader) and whose work is naive fp32 loops: the
// shape of what the GPU kernel's Ops supplies, with the tile engine and the
// CTA-wide copies left out.
#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "moe/bwd_queues.h"
#include "moe/fwd_sched.h"

namespace kosmos::moe {

constexpr int kFlagKinds = kMoeFlags, kCountKinds = 5, kQueueKinds = 5;

// One rank's buffers; every rank's are reachable (peer access), so a push is a store.
struct RankMem {
  uint64_t* flags[kFlagKinds];    // by MoeFlag
  uint32_t* counts[kCountKinds];  // by MoeCount
  uint32_t* queue;                // [kQueueKinds] claim counters
  uint32_t* finished;
  uint64_t* epoch;                // last epoch completed here
  int* table;                     // [ep][E] exchanged counts
  const int* route_idx;           // [t*k] the router's choices (its logits GEMM is not part of this check)
  const float* route_w;           // [t*k]
  const float* x;                 // [t][H]
  int *idx, *hist, *plan_counts, *start1, *pos, *order;
  float* w;                       // [t*k]
  MoeLayout* layout;
  float *arena[2], *act[2], *y[2];  // capped and dropless: [rows][H], [rows][I], [rows][H]
  float* ret;                     // [t*k][H]
  float* out;                     // [t][H]
  const float *w1, *w2;           // our experts: [E_l][H][2I] (gate, up), [E_l][I][H]
  // Backward: the dispatched dY rows, d(gate | up) [rows][2I], the weight gradients.
  float *dy[2], *dh[2];
  float *dw1, *dw2;               // [E_l][H][2I], [E_l][I][H]
};

struct CheckParams {
  MoeFwdShape s;
  int H, I, movers;
  uint64_t timeout_ns;
  RankMem mem[kEpMaxRanks];
};

struct CheckOps {
  const CheckParams& p;
  uint64_t e;
  int cta;

  KOSMOS_DEVICE const RankMem& me() const { return p.mem[p.s.rank]; }
  KOSMOS_DEVICE uint64_t* flag(int home, MoeFlag f, int i) const { return p.mem[home].flags[(int)f] + i; }
  KOSMOS_DEVICE int claim(MoeQueue q) { return (int)WorkQueue{me().queue + (int)q, 0}.claim(); }
  KOSMOS_DEVICE bool count(MoeCount k, int i, int target) {
    uint32_t* c = me().counts[(int)k] + i;
    if (add_acq_rel_gpu_u32(c, 1) + 1 != (uint32_t)target) return false;
    *c = 0;
    return true;
  }
  KOSMOS_DEVICE void release(MoeFlag f, int home, int i) {
    if (home == p.s.rank) store_release<Scope::kGpu>(flag(home, f, i), e);
    else store_release<Scope::kSys>(flag(home, f, i), e);
  }
  KOSMOS_DEVICE void wait(MoeFlag f, int i) {
    wait_ge<Scope::kSys>(flag(p.s.rank, f, i), e, p.timeout_ns, {"moe_fwd_check", p.s.rank, cta, moe_flag_name(f), i});
  }
  KOSMOS_DEVICE bool test(MoeFlag f, int i) { return load_acquire<Scope::kSys>(flag(p.s.rank, f, i)) >= e; }
  template <class Pred>
  KOSMOS_DEVICE void wait_each(MoeFlag f, int n, const Pred& pred) {
    for (int i = 0; i < n; ++i)
      if (pred(i)) wait(f, i);
  }
  KOSMOS_DEVICE const int* ends() { return me().hist; }
  KOSMOS_DEVICE const MoeLayout& layout() { return *me().layout; }
  KOSMOS_DEVICE const MoeLayout& local_layout() { return layout(); }
  KOSMOS_DEVICE int mode() { return me().layout->dropless; }
  KOSMOS_DEVICE void announce_ready() {
    for (int r = 0; r < p.s.ep; ++r) release(MoeFlag::kReady, r, p.s.rank);
  }
  KOSMOS_DEVICE void finish(int grid) {
    if (add_acq_rel_gpu_u32(me().finished, 1) != (uint32_t)grid - 1) return;
    for (int q = 0; q < kQueueKinds; ++q) me().queue[q] = 0;
    *me().finished = 0;
    store_release<Scope::kGpu>(me().epoch, e);
  }

  KOSMOS_DEVICE void route(int b) {
    int first, last;
    plan_block_pairs(moe_plan_shape(p.s), b, &first, &last);
    for (int q = first; q < last; ++q) {
      me().idx[q] = me().route_idx[q];
      me().w[q] = me().route_w[q];
    }
    plan_histogram(me().idx, moe_plan_shape(p.s), b, me().hist + (size_t)b * moe_experts(p.s));
  }
  KOSMOS_DEVICE void scan() {
    plan_scan(me().hist, moe_plan_shape(p.s), me().plan_counts, 0, 1);
    plan_segments<1>(me().plan_counts, moe_experts(p.s), me().start1);
  }
  KOSMOS_DEVICE void send_counts(int d) {
    for (int e2 = 0; e2 < moe_experts(p.s); ++e2)
      p.mem[d].table[p.s.rank * moe_experts(p.s) + e2] = me().plan_counts[e2];
  }
  KOSMOS_DEVICE void scatter(int b) {
    plan_scatter(me().idx, moe_plan_shape(p.s), b, me().hist + (size_t)b * moe_experts(p.s), me().start1, me().pos,
                 me().order);
  }
  KOSMOS_DEVICE void build_layout() { moe_build_layout(p.s, me().table, me().layout); }

  KOSMOS_DEVICE void push_part(const MoeMove& m) {
    const int ex = m.dst * p.s.e_local + m.x;
    int begin, end;
    moe_part_rows(p.s, ends(), m, &begin, &end);
    float* to = p.mem[m.dst].arena[mode()] + (size_t)layout().dst[ex] * p.H;
    for (int r = begin; r < end; ++r) {
      const float* row = me().x + (size_t)(me().order[me().start1[ex] + r] / p.s.top_k) * p.H;
      for (int h = 0; h < p.H; ++h) to[(size_t)r * p.H + h] = row[h];
    }
  }
  KOSMOS_DEVICE int build(const MoeLayout& L, int most) {
    return moe_build_serial(MoeBuilds<CheckOps>{*this, p.s, L}, most);
  }
  // Tile n of GEMM1: I / nt1 SwiGLU outputs, silu(gate) * up, per row of the block.
  KOSMOS_DEVICE void gemm1(const MoeTile& t) {
    const int cols = p.I / p.s.nt1;
    const float* w1 = me().w1 + (size_t)t.x * p.H * 2 * p.I;
    for (int i = 0; i < p.s.tile_m; ++i) {
      const size_t row = (size_t)t.rb * p.s.tile_m + i;
      for (int c = t.n * cols; c < (t.n + 1) * cols; ++c) {
        float g = 0.f, u = 0.f;
        for (int h = 0; h < p.H; ++h) {
          const float a = me().arena[mode()][row * p.H + h];
          g += a * w1[(size_t)h * 2 * p.I + c];
          u += a * w1[(size_t)h * 2 * p.I + p.I + c];
        }
        me().act[mode()][row * p.I + c] = g / (1.f + expf(-g)) * u;
      }
    }
  }
  KOSMOS_DEVICE void gemm2(const MoeTile& t) {
    const int cols = p.H / p.s.nt2;
    const float* w2 = me().w2 + (size_t)t.x * p.I * p.H;
    for (int i = 0; i < p.s.tile_m; ++i) {
      const size_t row = (size_t)t.rb * p.s.tile_m + i;
      for (int c = t.n * cols; c < (t.n + 1) * cols; ++c) {
        float acc = 0.f;
        for (int n = 0; n < p.I; ++n) acc += me().act[mode()][row * p.I + n] * w2[(size_t)n * p.H + c];
        me().y[mode()][row * p.H + c] = acc;
      }
    }
  }
  KOSMOS_DEVICE void push_unit(const MoeUnit& u) {
    int row;
    const int rows = moe_unit_rows(p.s, layout(), u, &row);
    float* to = p.mem[u.dst].ret + (size_t)layout().ret[u.dst * p.s.e_local + u.x] * p.H;
    for (size_t i = 0; i < (size_t)rows * p.H; ++i) to[i] = me().y[mode()][(size_t)row * p.H + i];
  }
  KOSMOS_DEVICE void fold(int, int first, int last) {
    const int k = p.s.top_k;
    for (int tok = first; tok < last; ++tok) {
      auto row = [&](int j, int i) {
        const int q = tok * k + j;
        const MoeRowRef r = moe_pair_row(p.s, layout(), me().start1, me().idx[q], me().pos[q]);
        return (r.local ? me().y[mode()] : me().ret)[(size_t)r.row * p.H + i];
      };
      auto out = [&](int i, float v) { me().out[(size_t)tok * p.H + i] = v; };
      moe_fold_token(k, me().w + (size_t)tok * k, p.H, 0, 1, row, out);
    }
  }
};

// The backward's build queue (moe/bwd_queues.h) over the same control words:
// the dY rows arrive in the arena's dy, the dX rows leave through y (the
// forward's output rows), whose units and fold the forward's code moves.
struct CheckBwdOps : CheckOps {
  KOSMOS_DEVICE int build(const MoeLayout& L, int most) {
    return moe_build_serial(MoeBwdBuilds<CheckBwdOps>{*this, p.s, L, MoeWgradTiles{p.I, p.H}}, most);
  }
  // d(gate | up) of columns of block n of I: dact = dY W2^T, then SwiGLU's backward.
  KOSMOS_DEVICE void dgrad2(const MoeTile& t) {
    const int cols = p.I / p.s.nt1, I2 = 2 * p.I;
    const float *w1 = me().w1 + (size_t)t.x * p.H * I2, *w2 = me().w2 + (size_t)t.x * p.I * p.H;
    for (int i = 0; i < p.s.tile_m; ++i) {
      const size_t row = (size_t)t.rb * p.s.tile_m + i;
      for (int c = t.n * cols; c < (t.n + 1) * cols; ++c) {
        float g = 0.f, u = 0.f, da = 0.f;
        for (int h = 0; h < p.H; ++h) {
          const float a = me().arena[mode()][row * p.H + h];
          g += a * w1[(size_t)h * I2 + c];
          u += a * w1[(size_t)h * I2 + p.I + c];
          da += me().dy[mode()][row * p.H + h] * w2[(size_t)c * p.H + h];
        }
        const float sg = 1.f / (1.f + expf(-g));
        me().dh[mode()][row * I2 + c] = da * u * sg * (1.f + g * (1.f - sg));
        me().dh[mode()][row * I2 + p.I + c] = da * g * sg;
        me().act[mode()][row * p.I + c] = g * sg * u;
      }
    }
  }
  // dX rows, columns of block n of H: d(gate | up) W1^T.
  KOSMOS_DEVICE void dgrad1(const MoeTile& t) {
    const int cols = p.H / p.s.nt2, I2 = 2 * p.I;
    const float* w1 = me().w1 + (size_t)t.x * p.H * I2;
    for (int i = 0; i < p.s.tile_m; ++i) {
      const size_t row = (size_t)t.rb * p.s.tile_m + i;
      for (int c = t.n * cols; c < (t.n + 1) * cols; ++c) {
        float acc = 0.f;
        for (int f = 0; f < I2; ++f) acc += me().dh[mode()][row * I2 + f] * w1[(size_t)c * I2 + f];
        me().y[mode()][row * p.H + c] = acc;
      }
    }
  }
  // Row n of dW2[x] [I][H], and of dW1[x] [H][2I]: sums over the expert's rows.
  KOSMOS_DEVICE void wgrad2(const MoeTile& t) {
    const int first = layout().rb[t.x] * p.s.tile_m, rows = moe_src(p.s, layout(), t.x, p.s.ep);
    for (int m = 0; m < p.H; ++m) {
      float acc = 0.f;
      for (int r = first; r < first + rows; ++r)
        acc += me().act[mode()][(size_t)r * p.I + t.n] * me().dy[mode()][(size_t)r * p.H + m];
      me().dw2[((size_t)t.x * p.I + t.n) * p.H + m] = acc;
    }
  }
  KOSMOS_DEVICE void wgrad1(const MoeTile& t) {
    const int first = layout().rb[t.x] * p.s.tile_m, rows = moe_src(p.s, layout(), t.x, p.s.ep), I2 = 2 * p.I;
    for (int f = 0; f < I2; ++f) {
      float acc = 0.f;
      for (int r = first; r < first + rows; ++r)
        acc += me().arena[mode()][(size_t)r * p.H + t.n] * me().dh[mode()][(size_t)r * I2 + f];
      me().dw1[((size_t)t.x * p.H + t.n) * I2 + f] = acc;
    }
  }
};

// One thread per CTA runs the CTA's life (the real kernel's CTAs are CTA-uniform).
__global__ void moe_fwd_check_kernel(CheckParams p) {
  CheckOps ops{p, launch_epoch(p.mem[p.s.rank].epoch), (int)blockIdx.x};
  moe_fwd_cta(ops, p.s, blockIdx.x, gridDim.x, p.movers);
}
__global__ void moe_bwd_check_kernel(CheckParams p) {
  CheckBwdOps ops{{p, launch_epoch(p.mem[p.s.rank].epoch), (int)blockIdx.x}};
  moe_fwd_cta(ops, p.s, blockIdx.x, gridDim.x, p.movers);
}

}  // namespace kosmos::moe
