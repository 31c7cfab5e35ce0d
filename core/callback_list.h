// Internal to ibev: an ordered list of callbacks, each registered with a
// Handle that keeps the wait rule of core/handle.h. Device watchers (the
// Dispatcher's device monitor) and device clients (verbs/device_clients.h)
// are such lists; the Registry's handlers have their own, sharded, tables.
//
// Calls go through a snapshot taken under the list's mutex, so a callback
// may add to the list or release any handle, its own included, while the
// list is being called; one released before its turn is skipped. A callback
// that throws is reported to the sink given to call_each() and the others
// still run.
#ifndef IBEV_CORE_CALLBACK_LIST_H_
#define IBEV_CORE_CALLBACK_LIST_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ibev/core/call_guard.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>

namespace ibev::detail {

template <typename Callback>
class CallbackList {
 public:
  enum class Order { kRegistration, kReverse };

  // Appends `callback`. The handle's release removes it and, unless released
  // from inside a call of it, waits until it is not running.
  Handle add(Callback callback) {
    auto entry = std::make_shared<Entry>(std::move(callback));
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->entries.push_back(entry);
    }
    return Handle([weak_state = std::weak_ptr<State>(state_),
                   weak_entry = std::weak_ptr<Entry>(entry)]() noexcept {
      auto entry = weak_entry.lock();
      if (!entry) return;
      if (auto state = weak_state.lock()) {
        std::lock_guard<std::mutex> lock(state->mutex);
        auto& entries = state->entries;
        entries.erase(std::remove(entries.begin(), entries.end(), entry), entries.end());
      }
      entry->guard.close();
      entry->guard.wait_idle();
    });
  }

  bool empty() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->entries.empty();
  }

  // Calls `invoke(callback)` for every callback registered now and not
  // released, in `order`. What one throws goes to `sink` as a kHandlerThrew
  // Failure naming `what_ran`.
  template <typename Invoke>
  void call_each(Order order, const Invoke& invoke, const FailureSink& sink,
                 const char* what_ran) const {
    std::vector<std::shared_ptr<Entry>> snapshot;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      snapshot = state_->entries;
    }
    if (order == Order::kReverse) std::reverse(snapshot.begin(), snapshot.end());
    for (const auto& entry : snapshot) {
      if (!entry->guard.try_enter()) continue;
      if (auto threw = exception_text([&] { invoke(entry->callback); })) {
        send_to(sink, Failure::handler_threw(what_ran, std::move(*threw)));
      }
      entry->guard.leave();
    }
  }

 private:
  struct Entry {
    explicit Entry(Callback c) : callback(std::move(c)) {}
    CallGuard guard;
    const Callback callback;
  };
  struct State {
    mutable std::mutex mutex;
    std::vector<std::shared_ptr<Entry>> entries;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_CALLBACK_LIST_H_
