// CPU time for the benchmarks: what a process (RUSAGE_SELF) or the calling
// thread (RUSAGE_THREAD) has used, user + system, in seconds.
#ifndef IBEV_BENCH_CPU_TIME_H_
#define IBEV_BENCH_CPU_TIME_H_

#include <sys/resource.h>

namespace bench {

inline double cpu_seconds(int who = RUSAGE_SELF) {
  rusage usage{};
  getrusage(who, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

}  // namespace bench

#endif  // IBEV_BENCH_CPU_TIME_H_
