// ibev::Watch: the owning handle of something a Dispatcher watches (a
// device's async fd, a CQ's completions).
//
// Move-only. Releasing it (or destroying it) stops the watch; for the rules
// on waiting see the function that returned it. A Watch may outlive its
// Dispatcher: releasing it then does nothing.
#ifndef IBEV_DISPATCH_WATCH_H_
#define IBEV_DISPATCH_WATCH_H_

#include <functional>
#include <utility>

namespace ibev {

class [[nodiscard]] Watch {
 public:
  Watch() noexcept = default;
  explicit Watch(std::function<void()> release) noexcept
      : release_(std::move(release)) {}
  Watch(Watch&& other) noexcept : release_(std::exchange(other.release_, {})) {}
  Watch& operator=(Watch&& other) noexcept {
    if (this != &other) {
      release();
      release_ = std::exchange(other.release_, {});
    }
    return *this;
  }
  ~Watch() { release(); }

  // The release function must not throw.
  void release() noexcept {
    if (auto release = std::exchange(release_, {})) release();
  }
  bool active() const noexcept { return static_cast<bool>(release_); }

 private:
  std::function<void()> release_;
};

}  // namespace ibev

#endif  // IBEV_DISPATCH_WATCH_H_
