// librdmacm's devices, as ibev's calls move them (cm_devices.cc says how
// they are counted, and why a destroy and a look at the devices never
// overlap). Internal to cm/ and its tests; not installed.
#ifndef IBEV_CM_CM_DEVICES_H_
#define IBEV_CM_CM_DEVICES_H_

#include <rdma/rdma_cma.h>

namespace ibev::detail {

// librdmacm lets go of a removed device's context, if none of its ids is
// left on it. Any thread; never blocks on another thread (a look that
// would wait for a destroy is done by that destroy when it ends).
void release_removed_devices() noexcept;

// rdma_destroy_id, never within a look at the devices: its result, errno
// as it left it. Any thread, under the id's channel's `calls`.
int destroy_id(rdma_cm_id* id) noexcept;

}  // namespace ibev::detail

#endif  // IBEV_CM_CM_DEVICES_H_
