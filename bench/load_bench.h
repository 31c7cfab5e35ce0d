// softroce_bench's runs of many objects on one Dispatcher in one process:
// how dispatch cost grows with the number of CQs (scale), what ibev's
// wrappers cost in memory beyond rdma-core's (memory), and what a saturated
// CQ does to a port event's delay and to another CQ's latency (fairness).
#ifndef IBEV_BENCH_LOAD_BENCH_H_
#define IBEV_BENCH_LOAD_BENCH_H_

#include "bench/harness.h"

namespace bench {

int scale(const Args& args);
int memory(const Args& args);
int fairness(const Args& args);

}  // namespace bench

#endif  // IBEV_BENCH_LOAD_BENCH_H_
