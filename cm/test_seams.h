// Seams for tests only: hooks the CM calls at points where ordering bugs
// lived, so that tests can act there deterministically. Not part of the
// API; null (and free) unless a test sets them.
#ifndef IBEV_CM_TEST_SEAMS_H_
#define IBEV_CM_TEST_SEAMS_H_

#include <rdma/rdma_cma.h>

namespace ibev::detail::test_seams {

// Called by the active side's CONNECT_RESPONSE, its QP in RTS, right before
// the RTU (rdma_establish), on the dispatching thread. True: the RTU is not
// sent, as if lost on the wire (the CM sends it once and nothing answers
// it), and the handler hears ESTABLISHED all the same. This side is then up
// while its peer's id stays between REP and RTU until the test acts, a
// window a real RTU closes within a MAD round trip: where a peer that goes
// was seen rejecting the connection (REJECTED, status 28) instead of
// disconnecting it (#50).
extern bool (*lose_rtu)(rdma_cm_id* id);

// Called by release_removed_devices between rdma_get_devices and
// rdma_free_devices, on the thread looking: where an id's destroy once
// left its device's librdmacm PD allocated (cm_devices.cc).
extern void (*inside_device_lookup)();

}  // namespace ibev::detail::test_seams

#endif  // IBEV_CM_TEST_SEAMS_H_
