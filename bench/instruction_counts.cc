// The registry's and the dispatcher's work in one operation, as a count of
// instructions, which load on the machine cannot move (the 2-core CI host
// and the TCG VM are never quiet, and timings there differ by 2x run to
// run). Runs CASE's set-up, then N operations; bench/compare_builds.sh runs
// it under valgrind (callgrind) with N and 2N and divides the difference by
// N, so the set-up cancels out. Uses the public API only, so that the same
// file builds against an older tree for comparison.
//   instruction_counts CASE N
//   CASE: route_1k           route+deliver, events over 1k objects
//         route_spread_64k   route+deliver, events over 64k objects
//         inject             Dispatcher::inject, then run_once delivers it
//         attach_release     attach a QP handler, release it
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <ibev/core/registry.h>
#include <ibev/dispatch/dispatcher.h>

namespace {

std::uint64_t g_sink = 0;

ibv_qp* fake_qp(std::size_t i) {  // never dereferenced
  return reinterpret_cast<ibv_qp*>(std::uintptr_t{0x7f00'0000'0000} + i * 256);
}

void route(std::size_t objects, long n) {
  ibev::Registry registry;
  ibv_context device{};
  std::vector<ibev::Handle> held;
  for (std::size_t i = 0; i < objects; ++i) {
    held.push_back(registry.attach(fake_qp(i), [](const ibev::Event& e) {
      g_sink += static_cast<std::uint64_t>(e.code());
    }));
  }
  std::mt19937_64 rng(objects);
  for (long i = 0; i < n; ++i) {
    registry.route(ibev::Event::synthesize(&device, IBV_EVENT_COMM_EST, fake_qp(rng() % objects)));
  }
}

void inject(long n) {
  ibev::Dispatcher dispatcher;
  ibv_context device{};
  ibv_qp qp{};
  ibev::Handle handler = dispatcher.registry().attach(
      &qp, [](const ibev::Event& e) { g_sink += static_cast<std::uint64_t>(e.code()); });
  for (long i = 0; i < n; ++i) {
    dispatcher.inject(&device, IBV_EVENT_COMM_EST, &qp);
    dispatcher.run_once(std::chrono::milliseconds(0));
  }
}

void attach_release(long n) {
  ibev::Registry registry;
  for (long i = 0; i < n; ++i) {
    ibev::Handle handle =
        registry.attach(fake_qp(static_cast<std::size_t>(i)), [](const ibev::Event&) {});
    handle.release();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc == 3 ? std::strtol(argv[2], nullptr, 10) : 0;
  if (argc != 3 || n <= 0) {
    std::fprintf(stderr, "usage: instruction_counts CASE N\n");
    return 1;
  }
  const char* c = argv[1];
  if (std::strcmp(c, "route_1k") == 0) {
    route(1000, n);
  } else if (std::strcmp(c, "route_spread_64k") == 0) {
    route(65536, n);
  } else if (std::strcmp(c, "inject") == 0) {
    inject(n);
  } else if (std::strcmp(c, "attach_release") == 0) {
    attach_release(n);
  } else {
    std::fprintf(stderr, "instruction_counts: no case '%s'\n", c);
    return 1;
  }
  return g_sink == 0 && std::strcmp(c, "attach_release") != 0 ? 2 : 0;
}
