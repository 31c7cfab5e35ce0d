// <ibev/ibev.h>: all of ibev's public API in one include.
//
// ibev gives userspace RDMA code the kernel's event model: objects take their
// event handlers when they are made (verbs/), a Dispatcher reads every async
// fd, completion channel, CM event channel and application fd and routes
// through the Registry it carries (dispatch/, core/); CM ids take theirs at
// creation too (cm/). <ibev/dispatch/asio.h>, for Boost.Asio, is
// not included here.
// Each header included here states its own guarantees: thread-safety,
// lifetime, and which thread runs a handler. Include a single header instead
// (e.g. <ibev/verbs/queue_pair.h>) to depend on less.
#ifndef IBEV_IBEV_H_
#define IBEV_IBEV_H_

#include <ibev/version.h>

#include <ibev/cm/cm_event_type.h>
#include <ibev/cm/cm_id.h>
#include <ibev/cm/cm_session.h>
#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/event_type.h>
#include <ibev/core/executor.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>
#include <ibev/health/health.h>
#include <ibev/health/recovery.h>
#include <ibev/core/registry.h>
#include <ibev/dispatch/completions.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/event_wait.h>
#include <ibev/dispatch/replay.h>
#include <ibev/dispatch/worker_thread.h>
#include <ibev/formats/fault_schedule.h>
#include <ibev/formats/prometheus_text.h>
#include <ibev/formats/recording.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/connection_health.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/device_clients.h>
#include <ibev/verbs/prometheus_counters.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/rc_endpoint.h>
#include <ibev/verbs/shared_receive_queue.h>
#include <ibev/verbs/work_queue.h>

#endif  // IBEV_IBEV_H_
