// What ibev's tests share: bounded waits on a condition (never a fixed sleep
// as a guess), a proven absence that says why its window is enough,
// exceptions that must name what went wrong, and a counter a test can wait
// on. Header-only; Boost.Test reports the checks. eventually() holds the one
// sleep of the tests' waits: a test sleeps itself only to let time pass on
// purpose, and says so at the call.
#ifndef IBEV_TESTS_SUPPORT_TESTING_H_
#define IBEV_TESTS_SUPPORT_TESTING_H_

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace ibev::testing {

// Whether `condition` became true within `limit`, looked at every `every`.
// The limit only bounds a failing test; the soft-RoCE VM (TCG) needs room.
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds limit = std::chrono::seconds(20),
                       std::chrono::microseconds every = std::chrono::milliseconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return condition();
    std::this_thread::sleep_for(every);
  }
  return true;
}

// Proves an absence: `condition` stayed false for all of `window`, looked at
// every `every` (it fails as soon as it is true). `why` says why what must
// not happen would have happened within `window` (a period, a timer's due
// time, a path that takes microseconds); it is the failure's message.
inline boost::test_tools::assertion_result stays_false_for(
    const std::function<bool()>& condition, std::chrono::milliseconds window,
    const std::string& why,
    std::chrono::microseconds every = std::chrono::milliseconds(5)) {
  if (!eventually(condition, window, every)) return true;
  boost::test_tools::assertion_result result(false);
  result.message() << "became true within " << window.count() << " ms (" << why << ")";
  return result;
}

// `call` throws an `Exception` whose what() mentions `fragment`.
template <typename Exception>
void expect_throw(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    BOOST_ERROR("expected an exception mentioning '" + fragment + "'");
  } catch (const Exception& e) {
    BOOST_TEST(std::string(e.what()).find(fragment) != std::string::npos,
               "'" << e.what() << "' should mention '" << fragment << "'");
  }
}

// Counts calls from any thread and lets a test wait for them, bounded.
class Counter {
 public:
  void bump() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++count_;
    changed_.notify_all();
  }
  bool wait_for(int count, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return count_ >= count; });
  }
  int count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
};

}  // namespace ibev::testing

#endif  // IBEV_TESTS_SUPPORT_TESTING_H_
