// The soft-RoCE harness names its devices, netdevs and addresses in the
// environment (tools/softroce/softroce_run.sh); a benchmark reads them
// with the harness's defaults.
#ifndef IBEV_BENCH_ENV_OR_H_
#define IBEV_BENCH_ENV_OR_H_

#include <cstdlib>
#include <string>

namespace bench {

// The variable's value, or `fallback` when it is unset or empty.
inline std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

}  // namespace bench

#endif  // IBEV_BENCH_ENV_OR_H_
