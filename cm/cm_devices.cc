// librdmacm's devices, as ibev's calls move them. librdmacm opens a context
// of its own on every device its ids use, and counts the device's users:
// each id bound to it and each list rdma_get_devices handed out. An id's
// release that takes the count to 0 frees the device's PD (allocated when
// an id bound to it); rdma_free_devices taking it to 0 does not (rdma-core
// 44 to this day). So an id released between ibev's rdma_get_devices and
// its rdma_free_devices (a look at the devices) leaves the PD allocated
// until some later id on that device goes, seen as one PD too many after a
// removed device came back under a session's recovery (#50's campaign).
// An id is released by rdma_destroy_id, and inside rdma_get_cm_event when
// librdmacm drops a CONNECT_REQUEST's new id it could not set up.
//
// Locking: `mutex` is a leaf guarding the counts below and nothing else.
// A look never waits for a release: one that would overlap a release (or
// another look) is left `pending`, and the last release, or the look
// running, does it when it ends. A release waits for a look running, whose
// librdmacm calls take only librdmacm's own short-held lock: a release
// waits for the acks of its id's events, which another channel's
// dispatching thread may be about to give after its own look, so a look
// that waited for releases could deadlock. Ids an application releases
// through librdmacm itself are not covered.
#include <ibev/cm/cm_devices.h>

#include <condition_variable>

#include <ibev/cm/test_seams.h>
#include <ibev/core/thread_annotations.h>

namespace ibev::detail {

void (*test_seams::inside_device_lookup)() = nullptr;

namespace {

Mutex mutex;
std::condition_variable look_ended;
int releasing IBEV_GUARDED_BY(mutex) = 0;     // calls that may release an id, running
bool looking IBEV_GUARDED_BY(mutex) = false;  // a look running
bool pending IBEV_GUARDED_BY(mutex) = false;  // a look asked for while one of those ran

// Looks, and again while another was asked for meanwhile (no release
// runs during a look: IdRelease waits for it). `looking` is the caller's.
void look() noexcept {
  for (;;) {
    int count = 0;
    if (ibv_context** contexts = rdma_get_devices(&count)) {
      if (test_seams::inside_device_lookup != nullptr) test_seams::inside_device_lookup();
      rdma_free_devices(contexts);
    }
    MutexLock lock(mutex);
    if (!pending) {
      looking = false;
      break;
    }
    pending = false;
  }
  look_ended.notify_all();
}

}  // namespace

// librdmacm closes a removed device's context only when it has found the
// device gone from ibv_get_device_list (rdma_get_devices looks) and none of
// its ids is left on it. Until then the kernel's delete waits for that
// context, as for any.
void release_removed_devices() noexcept {
  {
    MutexLock lock(mutex);
    if (releasing > 0 || looking) {
      pending = true;
      return;
    }
    looking = true;
  }
  look();
}

IdRelease::IdRelease() noexcept {
  UniqueLock lock(mutex);
  look_ended.wait(lock.native(), []() IBEV_REQUIRES(mutex) { return !looking; });
  ++releasing;
}

IdRelease::~IdRelease() {
  {
    MutexLock lock(mutex);
    if (--releasing > 0 || !pending || looking) return;
    pending = false;
    looking = true;
  }
  look();
}

int destroy_id(rdma_cm_id* id) noexcept {
  int result = 0;
  int error = 0;
  {
    IdRelease release;
    result = rdma_destroy_id(id);
    error = errno;
  }
  errno = error;
  return result;
}

}  // namespace ibev::detail
