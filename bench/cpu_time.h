// CPU time for the benchmarks: what a process (RUSAGE_SELF) or the calling
// thread (RUSAGE_THREAD) has used, in seconds: user and system apart (on
// soft-RoCE the system share carries rxe's transport, which an HCA does in
// hardware), or their sum.
#ifndef IBEV_BENCH_CPU_TIME_H_
#define IBEV_BENCH_CPU_TIME_H_

#include <sys/resource.h>

namespace bench {

struct CpuTimes {
  double user = 0;
  double system = 0;
};

inline CpuTimes cpu_times(int who = RUSAGE_SELF) {
  rusage usage{};
  getrusage(who, &usage);
  return {static_cast<double>(usage.ru_utime.tv_sec) +
              static_cast<double>(usage.ru_utime.tv_usec) / 1e6,
          static_cast<double>(usage.ru_stime.tv_sec) +
              static_cast<double>(usage.ru_stime.tv_usec) / 1e6};
}

inline double cpu_seconds(int who = RUSAGE_SELF) {
  const CpuTimes times = cpu_times(who);
  return times.user + times.system;
}

}  // namespace bench

#endif  // IBEV_BENCH_CPU_TIME_H_
