// ibev::Handle: the one owning handle of everything ibev registers: an object's
// event handler or a device listener (Registry), a device's async fd, a CQ's
// completions or an application fd served by a Dispatcher.
//
// Move-only. release() (or destruction) undoes the registration, once; after
// it, active() is false. The wait rule is the same for every handle: released
// on a thread that is not running the handler, release() returns only when
// the handler is not running and never will again (so its captures may be
// destroyed); released from inside the handler itself (or from anything that
// handler calls), it returns at once and the handler is not called again. A
// handle may outlive what made it (a Registry, a Dispatcher): releasing it
// then does nothing. In a forked child, releasing an inherited handle touches
// nothing of the parent's (see dispatch/dispatcher.h).
//
// Threads: release() may run on any thread, the dispatching thread and an
// executor's included, and from inside any handler. One Handle is one
// object: two threads must not release (or move, or assign) the same Handle
// at once; to release from several places, give it one owner (a struct
// under the application's lock) or release it on one thread. Do not release
// it while holding a lock that its handler takes: the release waits for the
// handler (unless it is that handler).
//
// Memory: a Handle is one pointer to what it registered. A subscription
// that is its own registration (an object's event handler in the Registry,
// a CQ's watch in a Dispatcher) costs no allocation of its own: the Handle
// shares the subscription's block. A Handle made from a function keeps it in
// one block.
#ifndef IBEV_CORE_HANDLE_H_
#define IBEV_CORE_HANDLE_H_

#include <memory>
#include <type_traits>
#include <utility>

namespace ibev {

namespace detail {

// What a Handle owns: something registered, undone by release(), which a
// Handle calls once. It must not throw.
class Registration {
 public:
  virtual void release() noexcept = 0;

 protected:
  // Owned through the shared_ptr of the concrete type, which deletes it.
  ~Registration() = default;
};

// A registration undone by calling a function.
template <typename Release>
class ReleasedBy final : public Registration {
 public:
  explicit ReleasedBy(Release release) noexcept(
      std::is_nothrow_move_constructible_v<Release>)
      : release_(std::move(release)) {}
  void release() noexcept override { release_(); }

 private:
  Release release_;
};

}  // namespace detail

class [[nodiscard]] Handle {
 public:
  Handle() noexcept = default;
  explicit Handle(std::shared_ptr<detail::Registration> registration) noexcept
      : registration_(std::move(registration)) {}
  // `release` runs once, from release() or the destructor; it must not throw.
  // It may be move-only (it may hold other Handles). An empty one (a null
  // std::function or function pointer) makes an inactive Handle. Throws
  // std::bad_alloc.
  template <typename Release,
            typename = std::enable_if_t<
                std::is_invocable_v<Release&> &&
                !std::is_convertible_v<Release, std::shared_ptr<detail::Registration>>>>
  explicit Handle(Release release) {
    if constexpr (std::is_constructible_v<bool, const Release&>) {
      if (!static_cast<bool>(release)) return;
    }
    registration_ = std::make_shared<detail::ReleasedBy<Release>>(std::move(release));
  }

  Handle(Handle&& other) noexcept = default;
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      release();
      registration_ = std::move(other.registration_);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { release(); }

  void release() noexcept {
    if (auto registration = std::exchange(registration_, nullptr)) registration->release();
  }
  bool active() const noexcept { return static_cast<bool>(registration_); }

 private:
  std::shared_ptr<detail::Registration> registration_;
};

}  // namespace ibev

#endif  // IBEV_CORE_HANDLE_H_
