// librdmacm's devices, as ibev's calls move them. librdmacm opens a context
// of its own on every device its ids use, and counts the device's users:
// each id bound to it and each list rdma_get_devices handed out. An id's
// release that takes the count to 0 frees the device's PD (allocated when
// an id bound to it); rdma_free_devices taking it to 0 does not (rdma-core
// 44 to this day). So an id destroyed between ibev's rdma_get_devices and
// its rdma_free_devices leaves the PD allocated until some later id on that
// device goes, seen as one PD too many after a removed device came back
// under a session's recovery (#50's campaign, once in some runs).
//
// Locking: ibev's destroys share `lookups`; a lookup takes it alone, and
// only when it is free (try_lock): a destroy waits for the acks of its
// id's events, which another channel's dispatching thread may be about to
// give after its own lookup, so a lookup that waited for a destroy could
// deadlock. A lookup that finds a destroy in flight is left `pending`, and
// the last destroy to finish does it. Ids an application destroys through
// librdmacm itself are not covered.
#include <ibev/cm/cm_devices.h>

#include <atomic>
#include <mutex>
#include <shared_mutex>

#include <ibev/cm/test_seams.h>

namespace ibev::detail {

void (*test_seams::inside_device_lookup)() = nullptr;

namespace {

std::shared_mutex lookups;
std::atomic<bool> pending{false};

}  // namespace

// librdmacm closes a removed device's context only when it has found the
// device gone from ibv_get_device_list (rdma_get_devices looks) and none of
// its ids is left on it. Until then the kernel's delete waits for that
// context, as for any.
void release_removed_devices() noexcept {
  std::unique_lock<std::shared_mutex> alone(lookups, std::try_to_lock);
  if (!alone.owns_lock()) {
    pending = true;
    // A destroy that finished before `pending` was set did not see it.
    if (!alone.try_lock()) return;
  }
  pending = false;
  int count = 0;
  if (ibv_context** contexts = rdma_get_devices(&count)) {
    if (test_seams::inside_device_lookup != nullptr) test_seams::inside_device_lookup();
    rdma_free_devices(contexts);
  }
}

int destroy_id(rdma_cm_id* id) noexcept {
  int result = 0;
  int error = 0;
  {
    std::shared_lock<std::shared_mutex> shared(lookups);
    result = rdma_destroy_id(id);
    error = errno;
  }
  if (pending.exchange(false)) release_removed_devices();
  errno = error;
  return result;
}

}  // namespace ibev::detail
