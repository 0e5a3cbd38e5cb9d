// A control block's build queue as a tile scheduler (sched.next(t),
// gemm/tile_hooks.h) for a hook-free engine run: the claiming thread
// (portable: thread 0; Hopper: the claimer thread) takes the next index j of
// ctrl->build_next (kosmos/queue.h; left zero by the launch's last CTA) and
// builds tile order.at(j), until j reaches order.count(). It is
// gemm::StaticScheduler's claiming twin, over the same Order interface as
// gemm::SwizzledOrder: claiming lets a CTA that builds faster take more tiles,
// and a mover that joins late takes what is left.
#pragma once
#include "gemm/tile_problem.h"
#include "kosmos/platform.h"
#include "kosmos/queue.h"

namespace kosmos {

// Ctrl: the op's control block (AgCtrl, RsCtrl), kept whole so that the queue's
// address is taken where it is claimed, as the ops' own schedulers do.
template <class Ctrl, class Order>
struct QueueSched {
  Ctrl* ctrl;
  Order order;
  KOSMOS_DEVICE bool next(gemm::TileCoord& t) {
    const int j = (int)WorkQueue{&ctrl->build_next, 0}.claim();
    if (j >= order.count()) return false;
    t = order.at(j);
    return true;
  }
};

}  // namespace kosmos
