// librdmacm's devices, as ibev's calls move them (cm_devices.cc says how
// librdmacm counts them, and why a look at the devices and a call that may
// release an id never overlap). Internal to cm/ and its tests; not
// installed.
#ifndef IBEV_CM_CM_DEVICES_H_
#define IBEV_CM_CM_DEVICES_H_

#include <rdma/rdma_cma.h>

namespace ibev::detail {

// librdmacm lets go of a removed device's context, if none of its ids is
// left on it. Any thread; never waits for another thread: a look that
// would overlap a release (IdRelease) is done when the last one ends, on
// its thread.
void release_removed_devices() noexcept;

// Held around a librdmacm call that may release an id (rdma_destroy_id;
// rdma_get_cm_event, which drops a CONNECT_REQUEST's new id it could not
// set up). Constructing waits for a look running (librdmacm's calls only);
// the last to end does a look asked for meanwhile. Any thread.
class IdRelease {
 public:
  IdRelease() noexcept;
  ~IdRelease();
  IdRelease(const IdRelease&) = delete;
  IdRelease& operator=(const IdRelease&) = delete;
};

// rdma_destroy_id within an IdRelease: its result, errno as it left it.
int destroy_id(rdma_cm_id* id) noexcept;

}  // namespace ibev::detail

#endif  // IBEV_CM_CM_DEVICES_H_
