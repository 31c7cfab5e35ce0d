// <ibev/ibev_c.h>: ibev for C programs (C11), over the same library.
//
// The kernel's event model, as the C++ API gives it: a CQ, SRQ or QP takes
// its event handler when it is made (a function and a context pointer, as
// the kernel's ib_create_qp takes event_handler and qp_context), devices keep
// listeners with type and port filters, device clients hear devices come and
// go (ib_register_client), one dispatcher serves every fd. Handlers receive
// an ibev_event carrying the ibv_event_type and the rdma-core objects, so C
// code keeps using rdma-core directly for everything ibev does not wrap
// (ibev_qp_get() is the QP to post on).
//
// Errors, as rdma-core reports them. Functions that make something return it,
// or NULL with errno set (as ibv_create_qp); the others return 0 or an errno
// value (as ibv_modify_qp). Either way ibev_last_error() then says, for the
// calling thread, which call failed and why ("ibev_qp_create: ibv_create_qp:
// Cannot allocate memory"). Bad input (a NULL object, a filter naming events
// the target cannot carry) is EINVAL, never a crash. No C++ exception crosses
// this API: one thrown where C code cannot see it (a handler compiled as C++
// that throws) becomes a failure record (ibev_failure) and dispatch goes on.
//
// Threads. Handlers run on the dispatching thread: the dispatcher's own
// between ibev_dispatcher_start() and _stop(), or the caller of
// ibev_dispatcher_run_once() (a CQ made with ibev_cq_attr.dispatcher: its
// completions on that dispatcher's thread, its CQ_ERR on the device's; the
// two may run at once, so they share `context` with care). Every other call
// may be made from any thread, handlers included, with three exceptions: one
// object (a handle, a waiter) is one thread's at a time; a blocking call
// (ibev_waiter_wait, ibev_qp_drain) on the thread that drives run_once()
// waits out its timeout, as nobody dispatches meanwhile (on the dispatching
// thread itself it is EINVAL); and ibev_dispatcher_destroy() is never called
// from one of its handlers. Do not release or destroy while holding a lock
// the handler takes: the call waits for the handler.
//
// Lifetime. Each ibev_* object is one reference to the C++ object behind it.
// Destroying it drops that reference: the rdma-core object is destroyed then,
// or when the last object made with it is (a QP keeps its CQs, SRQ and PD;
// everything keeps its device). Destroy in rdma-core's order (QPs, then the
// CQs and SRQ, then the PD and the device) and each call destroys at once.
// When a CQ, SRQ or QP is destroyed its handler is detached first, and the
// call returns once the handler is not running (at once from inside that
// handler): then its context may be freed. A QP made with drain_on_destroy
// is drained after its _destroy returns, on the dispatching thread, and its
// CQs (whose handlers hear the flushes) go with it: keep their contexts
// until the dispatcher is destroyed. The same rule ends every registration
// (ibev_handle_release): after it returns, the function is not running and
// never will be. The dispatcher must outlive device clients and waiters;
// the other objects may outlive it (their calls that need it then fail with
// ENODEV).
//
// Before 1.0 the structs here may change with any minor version, as the
// C++ API may (the SONAME carries the minor: a program is rebuilt for each).
#ifndef IBEV_IBEV_C_H_
#define IBEV_IBEV_C_H_

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ibev_dispatcher ibev_dispatcher;
typedef struct ibev_device ibev_device;
typedef struct ibev_pd ibev_pd;
typedef struct ibev_mr ibev_mr;
typedef struct ibev_cq ibev_cq;
typedef struct ibev_srq ibev_srq;
typedef struct ibev_qp ibev_qp;
typedef struct ibev_clients ibev_clients;
typedef struct ibev_handle ibev_handle;
typedef struct ibev_waiter ibev_waiter;

// What the calling thread's last failed ibev call said; "" when none failed.
// Valid until another ibev call fails on this thread.
const char *ibev_last_error(void);

// ------------------------------------------------------------------ events

// What an event's element names.
enum ibev_element_kind {
  IBEV_ELEMENT_CQ,
  IBEV_ELEMENT_QP,
  IBEV_ELEMENT_SRQ,
  IBEV_ELEMENT_WQ,
  IBEV_ELEMENT_PORT,
  IBEV_ELEMENT_DEVICE,  // DEVICE_FATAL, and codes this build does not know
};

// Why a DEVICE_FATAL means the device is gone; NONE for every other event.
enum ibev_device_loss {
  IBEV_LOSS_NONE,
  IBEV_LOSS_REMOVED,          // its uverbs node went away (rdma link delete)
  IBEV_LOSS_FATAL,            // the kernel reported DEVICE_FATAL
  IBEV_LOSS_ASYNC_FD_FAILED,  // its async fd failed
};

enum ibev_severity {
  IBEV_SEVERITY_FATAL,
  IBEV_SEVERITY_ERROR,
  IBEV_SEVERITY_INFORMATIONAL,
  IBEV_SEVERITY_UNKNOWN,
};

// One async event. Unlike ibv_async_event's union, each element member is set
// only when the event carries that element (the others are NULL, or port 0),
// so the wrong member cannot be misread. Valid during the handler's call.
struct ibev_event {
  struct ibv_context *device;
  int code;          // an ibv_event_type, or a code this build does not know
  const char *name;  // as ibv_event_type_str() spells it
  enum ibev_element_kind element_kind;
  enum ibev_severity severity;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_srq *srq;
  struct ibv_wq *wq;
  int port;  // from 1; 0 when the event is not a port event
  // An object named by its number (a QP number) rather than its address.
  int numbered;
  uint32_t object_number;
  int synthesized;  // made by ibev (injected, or a loss), never acked
  enum ibev_device_loss loss;
};

typedef void (*ibev_event_fn)(const struct ibev_event *event, void *context);

// Which events a handler wants: `count` codes (0: every event that can reach
// it), and for a device listener a port (0: every port). Device events
// (DEVICE_FATAL, unknown codes) carry no port and pass any port. A negative
// code is EINVAL: no event has one.
struct ibev_filter {
  const int *codes;
  size_t count;
  int port;
};

// ---------------------------------------------------------------- failures

enum ibev_failure_kind {
  IBEV_FAILURE_HANDLER_THREW,
  IBEV_FAILURE_VERB_FAILED,
  IBEV_FAILURE_DEVICE_LOST,
  IBEV_FAILURE_DESTROY_FAILED,
  IBEV_FAILURE_UNDISPATCHED,
  IBEV_FAILURE_STALLED,
  IBEV_FAILURE_CONNECTION_FAILED,
};

// The one record of something that went wrong where no caller could be told
// (core/failure.h). Valid during the call of the failure function.
struct ibev_failure {
  enum ibev_failure_kind kind;
  const char *verb;         // the failing call, or what ran ("QP handler")
  int error;                // errno, 0 when none
  struct ibv_context *device;
  const void *object;
  int event_code;           // the event being delivered; -1 when none
  const char *what;         // the exception's text, or details
  const char *description;  // all of it on one line
};

// Runs on the thread where the failure happened; must not block.
typedef void (*ibev_failure_fn)(const struct ibev_failure *failure, void *context);

// -------------------------------------------------------------- dispatcher

enum ibev_device_monitor {
  IBEV_DEVICE_MONITOR_AUTO,
  IBEV_DEVICE_MONITOR_UEVENTS,
  IBEV_DEVICE_MONITOR_INOTIFY,
  IBEV_DEVICE_MONITOR_RESCAN,
  IBEV_DEVICE_MONITOR_OFF,
};

// Zero-initialised, or NULL: the defaults.
struct ibev_dispatcher_attr {
  unsigned batch;             // events and tasks per source per turn; 0: 16
  ibev_failure_fn on_failure;  // NULL: one line each to stderr
  void *failure_context;
  int stall_after_ms;  // the watchdog's threshold; 0: 1000; negative: none
  enum ibev_device_monitor device_monitor;
};

ibev_dispatcher *ibev_dispatcher_create(const struct ibev_dispatcher_attr *attr);
// Stops it; must not race other calls on it. Objects made through it may
// outlive it (see Lifetime above).
void ibev_dispatcher_destroy(ibev_dispatcher *dispatcher);
// A thread of its own. EINVAL when it runs already or run_once() runs.
int ibev_dispatcher_start(ibev_dispatcher *dispatcher);
// Joins the thread (from a handler: asks it to stop).
int ibev_dispatcher_stop(ibev_dispatcher *dispatcher);
// For the application's own loop: when fd() is readable, run_once() serves
// what is ready, waiting up to `timeout_ms` (negative: until something is);
// `served` (if not NULL) gets the number of sources served. fd() is -1 with
// errno EINVAL for a NULL dispatcher.
int ibev_dispatcher_fd(const ibev_dispatcher *dispatcher);
int ibev_dispatcher_run_once(ibev_dispatcher *dispatcher, int timeout_ms, size_t *served);

// Sends `event` (its event_type and the element member that type names, as
// rdma-core would fill it) through the same resolve-and-deliver path on the
// dispatching thread, as if `device` had raised it; never acked. EINVAL for a
// NULL object or a port below 1.
int ibev_dispatcher_inject(ibev_dispatcher *dispatcher, struct ibv_context *device,
                           const struct ibv_async_event *event);

// For rdma-core objects the application made itself: serve `device`'s async
// events (ibev_device_open() does this for the devices it opens), attach a
// handler to a CQ, QP, SRQ or WQ (`kind` says which `object` is), listen to a
// device's port and device events.
ibev_handle *ibev_dispatcher_watch_device(ibev_dispatcher *dispatcher,
                                          struct ibv_context *device);
ibev_handle *ibev_attach(ibev_dispatcher *dispatcher, enum ibev_element_kind kind,
                         void *object, const struct ibev_filter *filter,
                         ibev_event_fn handler, void *context);
ibev_handle *ibev_listen(ibev_dispatcher *dispatcher, struct ibv_context *device,
                         const struct ibev_filter *filter, ibev_event_fn handler,
                         void *context);

// `kind` must name what `object` is: the registry keys a handler by both, so
// a handler attached to a QP as a CQ would never be called.
// Ends a registration (see Lifetime); NULL is ignored.
void ibev_handle_release(ibev_handle *handle);

// ------------------------------------------------------------------ devices

// Opens the device called `name` (NULL or "": the first) and has
// `dispatcher` serve its async events. NULL with errno ENODEV when there is
// no such device.
ibev_device *ibev_device_open(ibev_dispatcher *dispatcher, const char *name);
// Another reference to the same device (a client's add hands out one that
// lasts only until its remove returns).
ibev_device *ibev_device_ref(ibev_device *device);
void ibev_device_destroy(ibev_device *device);
// The getters return NULL (or IBEV_LOSS_NONE) for a NULL object, setting
// nothing. NULL once the device is closed (after a loss).
struct ibv_context *ibev_device_context(const ibev_device *device);
const char *ibev_device_name(const ibev_device *device);
// IBEV_LOSS_NONE while the device is there; why it is gone after.
enum ibev_device_loss ibev_device_lost(const ibev_device *device);
// A device-wide listener (ib_register_event_handler): port and device events.
// Before a port event's listeners run, the device has read the port again.
ibev_handle *ibev_device_listen(ibev_device *device, const struct ibev_filter *filter,
                                ibev_event_fn handler, void *context);

// ib_register_client: `add` hears every device present and each added
// later; `remove` each removed one, after its listeners heard DEVICE_FATAL;
// then the device is closed. Both run on the dispatching thread. The
// ibev_device they get is lent, never to be destroyed: it is valid until
// remove returns, the client is unregistered or the clients destroyed,
// whichever comes first (ibev_device_ref() makes a reference of the
// caller's own). Each client is lent its own: compare devices by
// ibev_device_context(). An injected DEVICE_FATAL removes nothing.
struct ibev_client {
  const char *name;  // names it in failures
  void (*add)(ibev_device *device, void *context);
  void (*remove)(ibev_device *device, enum ibev_device_loss loss, void *context);
  void *context;
};
ibev_clients *ibev_clients_create(ibev_dispatcher *dispatcher);
// Stops adding and removing; waits for a call in progress.
void ibev_clients_destroy(ibev_clients *clients);
// Unregister by releasing the handle; remove is not called then.
ibev_handle *ibev_clients_register(ibev_clients *clients, const struct ibev_client *client);

// ------------------------------------------------------ domains and regions

ibev_pd *ibev_pd_create(ibev_device *device);
void ibev_pd_destroy(ibev_pd *pd);
struct ibv_pd *ibev_pd_get(const ibev_pd *pd);

// The memory stays the caller's and must outlive the region.
ibev_mr *ibev_mr_create(ibev_pd *pd, void *address, size_t length, int access);
void ibev_mr_destroy(ibev_mr *mr);
struct ibv_mr *ibev_mr_get(const ibev_mr *mr);

// -------------------------------------------------------- completion queues

enum ibev_cq_mode {
  IBEV_CQ_EVENT,     // sleeps on its completion channel between bursts
  IBEV_CQ_ADAPTIVE,  // keeps polling while completions come
  IBEV_CQ_POLLED,    // the application polls it (no channel, no handler)
};

// Zero-initialised, or NULL: the defaults.
struct ibev_cq_attr {
  int cqe;                  // 0: 64
  enum ibev_cq_mode mode;
  unsigned ack_batch;       // completion events per ibv_ack_cq_events; 0: 32
  unsigned poll_batch;      // work completions per ibv_poll_cq; 0: 16
  unsigned budget;          // work completions per turn; 0: 256
  int solicited_only;
  ibev_dispatcher *dispatcher;  // NULL: the device's
  int comp_vector;
};

// The work completions one ibv_poll_cq returned.
typedef void (*ibev_completion_fn)(struct ibv_cq *cq, const struct ibv_wc *wc, size_t count,
                                   void *context);

// ib_alloc_cq: completions to `on_completion` (NULL for IBEV_CQ_POLLED, else
// required), CQ_ERR to `on_event` (may be NULL), both with `context`. Armed
// before it returns.
ibev_cq *ibev_cq_create(ibev_device *device, const struct ibev_cq_attr *attr,
                        ibev_completion_fn on_completion, ibev_event_fn on_event,
                        void *context);
void ibev_cq_destroy(ibev_cq *cq);
struct ibv_cq *ibev_cq_get(const ibev_cq *cq);

// ---------------------------------------------------- shared receive queues

// SRQ_ERR and SRQ_LIMIT_REACHED to `on_event` (may be NULL).
ibev_srq *ibev_srq_create(ibev_pd *pd, uint32_t max_wr, uint32_t max_sge,
                          ibev_event_fn on_event, void *context);
void ibev_srq_destroy(ibev_srq *srq);
struct ibv_srq *ibev_srq_get(const ibev_srq *srq);
// The device raises SRQ_LIMIT_REACHED once the posted receives drop below it.
int ibev_srq_arm_limit(ibev_srq *srq, uint32_t limit);

// ------------------------------------------------------------- queue pairs

// Zero-initialised: an RC QP with ibev's defaults (16 work requests and one
// SGE each way) and a random first PSN.
struct ibev_qp_attr {
  ibev_cq *send_cq;  // required
  ibev_cq *recv_cq;  // required
  ibev_srq *srq;     // optional
  enum ibv_qp_type qp_type;  // 0: IBV_QPT_RC
  struct ibv_qp_cap cap;     // each zero count: the default
  int sq_sig_all;
  int fixed_psn;     // nonzero: send from `psn` (24 bits), not a random one
  uint32_t psn;
  int drain_on_destroy;  // the last reference going drains, then destroys
};

// ib_create_qp with its event handler: the QP's async events to `on_event`
// (may be NULL), whether they name it by address or by QP number.
ibev_qp *ibev_qp_create(ibev_pd *pd, const struct ibev_qp_attr *attr, ibev_event_fn on_event,
                        void *context);
void ibev_qp_destroy(ibev_qp *qp);
struct ibv_qp *ibev_qp_get(const ibev_qp *qp);

// What an RC peer needs to reach a QP, as ibv_rc_pingpong exchanges it.
struct ibev_rc_endpoint {
  uint32_t qp_num;
  union ibv_gid gid;
  uint32_t psn;  // the first PSN the QP sends with
  uint16_t lid;  // InfiniBand; 0 on RoCE
};
// ibv_rc_pingpong's text form: "LLLL:QQQQQQ:PPPPPP:" and 32 hex digits, then
// a NUL (counted in the size: send all of it).
#define IBEV_RC_ENDPOINT_WIRE_SIZE 52
int ibev_rc_endpoint_to_wire(const struct ibev_rc_endpoint *endpoint,
                             char wire[IBEV_RC_ENDPOINT_WIRE_SIZE]);
int ibev_rc_endpoint_from_wire(const char *wire, size_t length,
                               struct ibev_rc_endpoint *endpoint);

// The attributes set on the way to RTS. Start from ibev_connect_attr_init()
// (ibv_rc_pingpong's, the defaults a NULL attr means): unlike the other
// attrs here, a zeroed one is not the defaults (port 0, no retries, an
// infinite ACK timeout).
struct ibev_connect_attr {
  uint8_t port;
  int gid_index;
  unsigned int access_flags;
  enum ibv_mtu path_mtu;  // 0: the port's active MTU
  uint8_t timeout;
  uint8_t retry_cnt;
  uint8_t rnr_retry;
  uint8_t min_rnr_timer;
  uint8_t max_rd_atomic;
  uint8_t max_dest_rd_atomic;
  uint8_t service_level;
  uint8_t traffic_class;
  uint8_t hop_limit;
  uint16_t pkey_index;
};
void ibev_connect_attr_init(struct ibev_connect_attr *attr);

// This QP as its peer sees it (the GID and LID of `port`).
int ibev_qp_endpoint(const ibev_qp *qp, uint8_t port, int gid_index,
                     struct ibev_rc_endpoint *endpoint);
// RESET or INIT -> RTS, connected to `remote`.
int ibev_qp_connect(ibev_qp *qp, const struct ibev_rc_endpoint *remote,
                    const struct ibev_connect_attr *attr);

// ib_drain_qp: the QP goes to ERR; returns once every work request posted
// before has completed and the CQ's handler has had those completions
// (a QP on an SRQ: its send queue, then QP_LAST_WQE_REACHED). Not on the
// dispatching thread (EINVAL): it delivers what the drain waits for. Not
// for a QP on an IBEV_CQ_POLLED CQ (EINVAL: the C++ API's drain polls it).
// ETIMEDOUT after `timeout_ms` (0: 5000) per queue.
struct ibev_drain_report {
  int send_drained;
  int receive_drained;
  int last_wqe_reached;  // -1: not a QP on an SRQ; 0: its wait timed out
};
int ibev_qp_drain(ibev_qp *qp, int timeout_ms, struct ibev_drain_report *report);

// ----------------------------------------------------------------- waiting

enum ibev_wait_outcome {
  IBEV_WAIT_EVENT,        // the event came
  IBEV_WAIT_TIMED_OUT,
  IBEV_WAIT_DEVICE_LOST,  // the target's device is gone (the event says how)
};

// One event of one object or device, with a timeout (above 0): arm it
// before the action that raises the event, then wait. It also ends when the
// target's device is lost (an injected DEVICE_FATAL does not end it). `kind` says what `target` is (an
// ibv_cq, ibv_qp, ibv_srq, ibv_wq, or for IBEV_ELEMENT_DEVICE an ibv_context,
// whose port and device events it hears).
ibev_waiter *ibev_wait_for(ibev_dispatcher *dispatcher, enum ibev_element_kind kind,
                           void *target, const struct ibev_filter *filter, int timeout_ms);
// Blocks until the event, the device's loss or the timeout; `event` (if not
// NULL) gets the event for IBEV_WAIT_EVENT and DEVICE_LOST. EINVAL on the
// dispatching thread, which delivers what it waits for.
int ibev_waiter_wait(ibev_waiter *waiter, enum ibev_wait_outcome *outcome,
                     struct ibev_event *event);
void ibev_waiter_destroy(ibev_waiter *waiter);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // IBEV_IBEV_C_H_
