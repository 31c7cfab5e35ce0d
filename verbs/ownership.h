// Internal to verbs/: how every wrapper owns its rdma-core object, and the
// one teardown they all share.
//
// Owned<T> holds the object and the Handles that serve it (its event handler,
// its completions: at most `Served`, held inline, since a wrapper is made per
// QP and CQ). close() releases the handles, newest first (completions
// before the event handler: a release acks what it read, so the destroy verb
// never blocks on ibev), then destroys the object, as pyverbs' close() does.
// It is idempotent, and the destructor calls it. A destroy verb that fails
// there cannot throw: it becomes a Failure (kDestroyFailed) for the device's
// Registry sink, and the object is given up (not retried).
//
// The object pointer is atomic so that get() may race with a close() on the
// dispatching thread (a lost device closes everything made on it): a reader
// sees the object or null, never a torn value. Using the object it got is
// still the caller's business (verbs/device.h: stop posting first).
//
// Fork: a forked child shares the parent's uverbs file, so a destroy verb
// run there destroys the parent's object (ibv_fork_init(3): the child may not
// use them). An Owned inherited by a child is inert: close() forgets the
// object without its destroy verb and its handles without releasing them
// (locks the parent's threads held at the fork stay held in the child), so
// a child may drop whatever it inherited, then exit or exec.
//
// Closeable is what Device::close() reaches: every wrapper made on a device
// is one, so that an application can tear down everything of a device (after
// DEVICE_FATAL, say) without finding every shared_ptr.
#ifndef IBEV_VERBS_OWNERSHIP_H_
#define IBEV_VERBS_OWNERSHIP_H_

#include <infiniband/verbs.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <ibev/core/failure.h>
#include <ibev/core/handle.h>
#include <ibev/core/process.h>
#include <ibev/core/registry.h>

namespace ibev::detail {

class Closeable {
 public:
  virtual ~Closeable() = default;
  virtual void close() noexcept = 0;
};

void report_destroy_failure(Registry* registry, ibv_context* device, const char* verb,
                            int error, const void* object) noexcept;

// Throws std::system_error(ENODEV) naming `verb`: the object was closed.
[[noreturn]] void throw_closed(const char* verb);

template <typename T, int (*Destroy)(T*), const char* Verb, std::size_t Served = 1>
class Owned {
  static_assert(Served <= 255, "served_ counts them in a byte");

 public:
  Owned() noexcept = default;
  // `registry` receives a failing destroy; null: stderr.
  Owned(T* object, ibv_context* device, Registry* registry) noexcept
      : object_(object), device_(device), registry_(registry) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { close(); }

  T* get() const noexcept { return object_.load(std::memory_order_acquire); }
  // The object, or std::system_error(ENODEV) naming `verb` once closed.
  // Call it only from libibev's own .cc files: throw_closed is not exported.
  T* require(const char* verb) const {
    T* object = get();
    if (object == nullptr) throw_closed(verb);
    return object;
  }
  // Throws std::logic_error when `Served` handles are held already: a
  // wrapper that serves its object more ways says so in its Owned's type.
  void serve_with(Handle handle) {
    if (served_ == Served) throw std::logic_error(std::string(Verb) + ": no room to serve it");
    handles_[served_++] = std::move(handle);
  }
  // True in a child forked after the object was made: it is the parent's.
  // Asked of the kernel: a destroy verb follows the answer.
  bool inherited() const noexcept { return process_.inherited_now(); }

  // Gives the object up without destroying it, its handles released first:
  // the caller destroys it (a QP draining before its destroy).
  T* release() noexcept {
    release_handles();
    return object_.exchange(nullptr, std::memory_order_acq_rel);
  }

  void close() noexcept {
    if (inherited() && served_ > 0) {
      // The parent's threads may have held any lock a release would take
      // when the child was forked: its handles are let go of unreleased.
      static_cast<void>(
          std::make_unique<std::array<Handle, Served>>(std::move(handles_)).release());
      served_ = 0;
    }
    release_handles();
    T* object = object_.exchange(nullptr, std::memory_order_acq_rel);
    if (object != nullptr && !inherited()) {
      if (const int rc = Destroy(object); rc != 0) {
        report_destroy_failure(registry_, device_, Verb, rc, object);
      }
    }
  }

 private:
  void release_handles() noexcept {
    while (served_ > 0) handles_[--served_].release();
  }

  std::atomic<T*> object_{nullptr};
  ibv_context* device_ = nullptr;
  Registry* registry_ = nullptr;
  std::array<Handle, Served> handles_;
  std::uint8_t served_ = 0;
  OwningProcess process_;
};

}  // namespace ibev::detail

#endif  // IBEV_VERBS_OWNERSHIP_H_
