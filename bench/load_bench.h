// softroce_bench's runs of many objects on one Dispatcher in one process:
// how dispatch cost grows with the number of CQs (scale), what ibev's
// wrappers cost in memory beyond rdma-core's (memory), and what a saturated
// CQ does to a port event's delay and to another CQ's latency (fairness).
//
//   softroce_bench scale --pairs N [--channels C] [--messages N]
//                        [--mode event|adaptive|raw-event|raw-floor] [--ack-batch K]
//     raw-event: perftest's order, hash-indexed; raw-floor: ibev's order,
//     no hashing, the floor under ibev's loop.
//   softroce_bench memory --pairs N
//   softroce_bench memory-blocks --pairs N  (the headline's pairs made, then
//                           an exit that frees nothing: for valgrind's DHAT)
//   softroce_bench fairness --load 0|1|2 [--load-rate MSGS_PER_S] [--mode M]
//                           [--turn-budget B] [--rounds N]
#ifndef IBEV_BENCH_LOAD_BENCH_H_
#define IBEV_BENCH_LOAD_BENCH_H_

#include "bench/harness.h"

namespace bench {

int scale(const Args& args);
int memory(const Args& args);
int fairness(const Args& args);

}  // namespace bench

#endif  // IBEV_BENCH_LOAD_BENCH_H_
