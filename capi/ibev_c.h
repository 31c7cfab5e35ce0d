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
// two may run at once, so they share `context` with care; a health's
// handler and reconnect function on its ibev_worker, when it has one).
// Every other call may be made from any thread, handlers included, with
// these exceptions: one object (a handle, a waiter) is one thread's at a
// time; a blocking call (ibev_waiter_wait, ibev_qp_drain) on the thread that
// drives run_once() waits out its timeout, as nobody dispatches meanwhile
// (on the dispatching thread itself it is EINVAL);
// ibev_dispatcher_destroy() is never called from one of its handlers, nor
// ibev_worker_destroy() from a task on that worker; and
// ibev_replay_play_file() at a speed above 0 is never called on the
// dispatching thread (nothing would be delivered while it waits). Do not
// release or destroy while holding a lock the handler takes: the call waits
// for the handler.
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
typedef struct ibev_worker ibev_worker;
typedef struct ibev_health ibev_health;
typedef struct ibev_recovery_attempt ibev_recovery_attempt;
typedef struct ibev_cm_channel ibev_cm_channel;
typedef struct ibev_cm_id ibev_cm_id;
typedef struct ibev_cm_session ibev_cm_session;
typedef struct ibev_cm_acceptor ibev_cm_acceptor;
typedef struct ibev_replay ibev_replay;

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
// RESET -> INIT with `attr`'s port, P_Key index and access flags (NULL: the
// defaults): the QP takes receives from here on, so they can be posted
// before the peer's endpoint arrives (as in a recovery attempt, whose QP is
// in RESET).
int ibev_qp_to_init(ibev_qp *qp, const struct ibev_connect_attr *attr);
// Any state -> RESET, as a reconnection in place begins: what was posted
// and not completed is gone without a completion (drain first to have it
// completed), and the first PSN is drawn anew (a fixed_psn QP keeps its
// own), so that the old connection's packets are not taken for the new
// one's: advertise ibev_qp_endpoint() again.
int ibev_qp_reset(ibev_qp *qp);
// RESET or INIT -> RTS, connected to `remote`.
int ibev_qp_connect(ibev_qp *qp, const struct ibev_rc_endpoint *remote,
                    const struct ibev_connect_attr *attr);

// ib_drain_qp: the QP goes to ERR; returns once every work request posted
// before has completed and the CQ's handler has had those completions
// (a QP on an SRQ: its send queue, then QP_LAST_WQE_REACHED). Not on the
// dispatching thread (EINVAL): it delivers what the drain waits for. Not
// for a QP on an IBEV_CQ_POLLED CQ (EINVAL: the C++ API's drain polls it).
// ETIMEDOUT after `timeout_ms` (0: 5000) per queue; a negative one is
// EINVAL.
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

// ---------------------------------------------------------------- executors

// A thread of its own that runs tasks in the order given (ibev::WorkerThread,
// the kernel's IB_POLL_WORKQUEUE): a health handler given one as its
// executor runs there, so it may block (a peer's endpoint read from a
// socket) while the dispatcher goes on serving completions. `on_failure`
// (NULL: one line to stderr) hears a task that threw (a C++ function passed
// as a C one); the thread goes on.
ibev_worker *ibev_worker_create(ibev_failure_fn on_failure, void *context);
// Runs the tasks already posted, then joins. Never from its own thread (it
// would wait for itself), and not while anything made with it (a health)
// may still post to it: destroy those first. NULL is ignored.
void ibev_worker_destroy(ibev_worker *worker);
// Runs `task(context)` on the worker's thread, after the tasks posted
// before it. EINVAL for a NULL worker or task. Any thread.
int ibev_worker_post(ibev_worker *worker, void (*task)(void *context), void *context);
// Whether the calling thread is the worker's (0 for a NULL worker).
int ibev_worker_is_current(const ibev_worker *worker);

// ------------------------------------------------------------------ metrics

// ibev's in-process counters in the Prometheus text format (as
// ibev::write_metrics, docs/operations.md lists the names): the
// dispatcher's figures and, for each of the `count` devices, its events
// delivered, unclaimed and whose handler threw, its failures and its ports'
// cached state. Written into the caller's buffer, as snprintf writes: at
// most `size` - 1 characters and a NUL (nothing for `size` 0); `length`
// (if not NULL) gets the whole text's length without the NUL, so a text
// that did not fit (length >= size) is asked for again with length + 1. A
// buffer, not a FILE *: it serves an HTTP /metrics answer, a textfile
// collector's file (fputs) or a log alike, with no stdio stream in C++.
// Any thread, the dispatching one included; never waits for a handler.
// EINVAL for a NULL dispatcher, a NULL device in the list, or a NULL
// buffer with a size above 0.
int ibev_write_metrics(const ibev_dispatcher *dispatcher, ibev_device *const *devices,
                       size_t count, char *buffer, size_t size, size_t *length);

// ------------------------------------------------------- connection health

// One health signal for an RC connection (a QP with its peer), as
// ibev::ConnectionHealth (verbs/connection_health.h says what it hears by
// itself and what it is told): the handler hears one change per transition
// (up, down, recovering, failed), each with the cause that made it, never
// one call per cause.
enum ibev_connection_state {
  IBEV_CONNECTION_UP,
  IBEV_CONNECTION_DOWN,
  IBEV_CONNECTION_RECOVERING,
  IBEV_CONNECTION_FAILED,  // for good
};

// Where a cause was heard; ibev_health_cause.code is read by it.
enum ibev_health_source {
  IBEV_HEALTH_COMPLETION,   // an error completion: its ibv_wc_status; wr_id names it
  IBEV_HEALTH_ASYNC_EVENT,  // a QP's, its port's or its device's event: its ibv_event_type
  IBEV_HEALTH_CM_EVENT,     // a CM event: its rdma_cm_event_type
  IBEV_HEALTH_KEEPALIVE,    // no keepalive answer in time (code 0), or an error status
  IBEV_HEALTH_DEADLINE,     // a request outstanding past its deadline: wr_id names it
  IBEV_HEALTH_APPLICATION,  // the application's own reason, in `what`
  IBEV_HEALTH_RECOVERY,     // a recovery attempt failed, or recovery gave up
};

// Why a connection is not carrying traffic. `what` is for people
// ("IBV_EVENT_PORT_ERR", "IBV_WC_RETRY_EXC_ERR (wr_id 7)"); where it is
// valid says the function that hands the cause out.
struct ibev_health_cause {
  enum ibev_health_source source;
  int code;
  uint64_t wr_id;
  const char *what;
};

// One transition. To down or failed, `cause` is what made it; to
// recovering or up, the outage's first cause (source APPLICATION, code 0,
// what "" when there was none). Valid during the handler's call.
struct ibev_health_change {
  enum ibev_connection_state from;
  enum ibev_connection_state to;
  struct ibev_health_cause cause;
};

// Runs on the dispatching thread (or the attr's executor), one call at a
// time, in the order of the transitions, with no lock of ibev's held: it
// may call any ibev_health_* function on its own health.
typedef void (*ibev_health_fn)(const struct ibev_health_change *change, void *context);

// One attempt to bring the connection back, lent to the reconnect
// function (see ibev_health_attr.reconnect) for its call; it must end with
// exactly one of ibev_recovery_attempt_connect(), _replace() or _fail():
// an attempt whose last reference goes unsettled failed ("abandoned"), and
// the next is scheduled.
typedef void (*ibev_reconnect_fn)(const ibev_recovery_attempt *attempt, void *context);

// How a recovery attempt brings the connection back.
enum ibev_recovery_mode {
  IBEV_RECOVERY_RESET_IN_PLACE,  // the QP drained, reset, connected again
  IBEV_RECOVERY_RECONNECT,       // the QP drained and let go: a new one replaces it
};

// When attempts are made and when recovery gives up (health/recovery.h):
// backoff from first_delay_ms doubling to max_delay_ms, each shrunk by a
// random share of up to `jitter` (0 to 1); an outage that lasts
// give_up_after_ms fails the connection for good, as does a down after
// max_recoveries recoveries within window_ms.
struct ibev_recovery_policy {
  int first_delay_ms;
  int max_delay_ms;
  double jitter;
  unsigned max_recoveries;
  int window_ms;
  int give_up_after_ms;
};

// A health's options. Start from ibev_health_attr_init() (the defaults a
// NULL attr means): as with ibev_connect_attr, a zeroed one is not the
// defaults (a policy with no delay and no recoveries is refused).
struct ibev_health_attr {
  uint8_t port;  // whose PORT_ERR is a cause; 0: the QP's own
  int initial_down;  // nonzero: a connection not yet made, brought up by ibev_health_up()
  ibev_worker *executor;  // where the handler and reconnect run; NULL: the dispatching thread
  int keepalive_interval_ms;  // 0: no keepalive (a zero-length RDMA write each interval)
  unsigned keepalive_misses;  // intervals unanswered before it is a cause
  int deadline_ms;  // a request posted through ibev_health_post_send() this late is a cause
  // Recovery: none while `reconnect` is NULL (the application moves the
  // state itself). In place, `connect` is what an attempt connects with,
  // its port and GID index make the attempt's local endpoint.
  enum ibev_recovery_mode mode;
  struct ibev_recovery_policy policy;
  struct ibev_connect_attr connect;
  ibev_reconnect_fn reconnect;
  void *reconnect_context;
};
void ibev_health_attr_init(struct ibev_health_attr *attr);

// Watches `qp` (an RC QP, past RESET or to be connected) as one connection,
// holding it until the health is destroyed. EINVAL (ibev_last_error() says
// which) for a NULL QP or handler, a closed or non-RC QP, a port beyond the
// device's, a negative interval or deadline, no misses, a keepalive or
// recovery on an IBEV_CQ_POLLED CQ, or a policy recovery refuses (a
// first_delay_ms not above 0, a max_delay_ms below it, a jitter outside
// [0, 1], no recoveries, a window or give-up not above 0); an errno from
// ibv_query_qp or ibv_query_port.
ibev_health *ibev_health_create(ibev_qp *qp, const struct ibev_health_attr *attr,
                                ibev_health_fn on_change, void *context);
// Closes it: the handler and the reconnect function are stopped, waiting
// for a running call unless it is that call's own thread (from inside them
// it returns at once, and they are never called again); an attempt still
// held connects nothing (ECANCELED). Then the QP is let go. NULL is ignored.
void ibev_health_destroy(ibev_health *health);

// The state now (IBEV_CONNECTION_FAILED, with errno EINVAL, for NULL).
enum ibev_connection_state ibev_health_state(const ibev_health *health);
// The causes heard since the connection was last up, first first (64 at
// most): up to `capacity` of them into `causes`, `count` (required) gets how
// many there are. Their `what` strings are valid until the calling thread's
// next ibev_health_causes().
int ibev_health_causes(const ibev_health *health, struct ibev_health_cause *causes,
                       size_t capacity, size_t *count);
// The keepalive's probes posted and answered in time.
int ibev_health_keepalive_stats(const ibev_health *health, uint64_t *sent, uint64_t *answered);
// The QP the connection runs on now (after a replace, the newest; NULL
// before the first and for a NULL health): valid while the health holds
// it, so not across a recovery in IBEV_RECOVERY_RECONNECT mode.
struct ibv_qp *ibev_health_qp(const ibev_health *health);

// A completion polled from one of the QP's CQs (another QP's is ignored).
// With a deadline or recovery, give it every one, flushes too: a drain
// waits for them.
int ibev_health_completion(ibev_health *health, const struct ibv_wc *wc);
// ibv_post_send through the health: each request is tracked for its
// deadline and, if not delivered, listed in the next attempt's
// undelivered. ENOTCONN with recovery while the connection is not up
// (nothing posted: send it once up); otherwise ibv_post_send's errno, with
// `bad_wr` (if not NULL) at the first request not posted.
int ibev_health_post_send(ibev_health *health, struct ibv_send_wr *wr,
                          struct ibv_send_wr **bad_wr);
// A cause the application knows (a timeout of its own, a CM event): `what`
// is copied. An up or recovering connection goes down.
int ibev_health_add_cause(ibev_health *health, const struct ibev_health_cause *cause);
// With recovery: the way to the peer is back (the peer asked to reconnect):
// an attempt waited for starts now, and one in progress fails, the next
// starting at once.
int ibev_health_retry_now(ibev_health *health);
// The application's own moves, without recovery: down -> recovering,
// down or recovering -> up, any state -> failed for good (`cause` says why;
// NULL: an application cause with no text). A move from a state that has
// none is no change and no error.
int ibev_health_recovering(ibev_health *health);
int ibev_health_up(ibev_health *health);
int ibev_health_fail(ibev_health *health, const struct ibev_health_cause *cause);

// Another reference to the attempt, beyond the reconnect function's call
// (to settle it from another thread, when the peer answers); destroyed
// with ibev_recovery_attempt_destroy(). All references share one attempt.
ibev_recovery_attempt *ibev_recovery_attempt_ref(const ibev_recovery_attempt *attempt);
// An unsettled attempt whose last reference this was failed ("abandoned").
// NULL is ignored.
void ibev_recovery_attempt_destroy(ibev_recovery_attempt *attempt);
// 1 for an outage's first attempt (0 for NULL).
unsigned ibev_recovery_attempt_number(const ibev_recovery_attempt *attempt);
// What the outage began with; `what` valid while the attempt is.
int ibev_recovery_attempt_cause(const ibev_recovery_attempt *attempt,
                                struct ibev_health_cause *cause);
// The wr_ids posted through ibev_health_post_send() and not delivered, in
// posting order (theirs to send again, or not, once up); valid while the
// attempt is. `count` is required; the array is NULL when it is 0.
int ibev_recovery_attempt_undelivered(const ibev_recovery_attempt *attempt,
                                      const uint64_t **wr_ids, size_t *count);
// In place: this QP as its peer must now see it (the new PSN): what the
// application tells the peer. EINVAL in IBEV_RECOVERY_RECONNECT mode.
int ibev_recovery_attempt_local(const ibev_recovery_attempt *attempt,
                                struct ibev_rc_endpoint *endpoint);
// In place: the QP, in RESET: ibev_qp_to_init() and ibv_post_recv() go
// there before _connect(). Reconnecting: the QP being replaced, drained
// (NULL for a connection's first attempt).
struct ibv_qp *ibev_recovery_attempt_qp(const ibev_recovery_attempt *attempt);
// Whether the attempt is unsettled and still the recovery's (no cause
// since, not closed): 1 or 0.
int ibev_recovery_attempt_current(const ibev_recovery_attempt *attempt);
// In place: RESET or INIT -> RTS against `remote` with the attr's
// `connect`: the connection is up. ECANCELED when the recovery ended
// meanwhile (failed, given up, closed), EALREADY when the attempt was
// settled; another errno (the failing ibv_modify_qp's) fails the attempt,
// and the next is scheduled.
int ibev_recovery_attempt_connect(const ibev_recovery_attempt *attempt,
                                  const struct ibev_rc_endpoint *remote);
// Reconnecting: the connection is up again on `qp`, a new RC QP in RTS,
// connected, on the same dispatcher; from now on its events and
// completions are the connection's. EINVAL in place or for a QP the
// health cannot use; ECANCELED, EALREADY as _connect(). Any error fails
// the attempt.
int ibev_recovery_attempt_replace(const ibev_recovery_attempt *attempt, ibev_qp *qp);
// The attempt failed, `why` (NULL: no text): the next is scheduled.
// EALREADY when it was settled.
int ibev_recovery_attempt_fail(const ibev_recovery_attempt *attempt, const char *why);

// ------------------------------------------------------ connection manager

// A session: one logical RC connection through the RDMA connection manager
// that outlives its QPs, as ibev::CmSession and ibev::CmAcceptor
// (cm/cm_session.h says who reconnects, how a server knows a peer again by
// the session's id, and which CM events are causes). Its health is an
// ibev_health whose recovery replaces the QP: each attempt resolves and
// connects on a new CM id and asks the application for a new QP
// (ibev_make_qp_fn), on whatever device reaches the peer now.

// An rdma_event_channel served by `dispatcher` (which must outlive it and
// every session and acceptor made on it). ENODEV without rdma_cm in the
// kernel; EINVAL for a NULL dispatcher.
ibev_cm_channel *ibev_cm_channel_create(ibev_dispatcher *dispatcher);
// Drops this reference: the channel is served while an id, a session or an
// acceptor made on it holds it. NULL is ignored.
void ibev_cm_channel_destroy(ibev_cm_channel *channel);

// A CM id (ibev::CmId, cm/cm_id.h), one type for two owners: the
// application's own, from ibev_cm_id_create() or a CONNECT_REQUEST, or the
// one of a session's attempt, lent to ibev_make_qp_fn for its call (the
// session's: only the queries and ibev_cm_id_init_qp() take it, the other
// calls are EINVAL, and ibev_cm_id_destroy() ignores it).
//
// The name of the device it is bound to ("rxe0"): open that device (or find
// the one you have of that name) and make the QP there. "" until the
// address is resolved (or for a listener bound to any address); once known
// it stays, valid while the id is. NULL for a NULL id, or with errno set
// when it cannot be read.
const char *ibev_cm_id_device_name(const ibev_cm_id *id);
// Takes `qp` to INIT for this id (its port, P_Key, access), so that its
// receives can be posted before the QP is handed back (or given to
// ibev_cm_id_connect() or _accept(), which take it to INIT themselves if
// it is not).
int ibev_cm_id_init_qp(const ibev_cm_id *id, ibev_qp *qp);

// One CM event, copied before it was acked (cm/cm_id.h's CmEvent). Valid
// during the handler's call.
struct ibev_cm_event {
  int code;          // an enum rdma_cm_event_type, or a code this build does not know
  const char *name;  // the enumerator ("RDMA_CM_EVENT_ESTABLISHED"), as rdma_event_str()
  // 0, or a negative errno (ADDR_ERROR, UNREACHABLE, CONNECT_ERROR, ...), or
  // for REJECTED the CM's reject reason (28: the consumer rejected).
  int status;
  ibev_cm_id *id;  // the id that hears it (for CONNECT_REQUEST, the listener)
  // CONNECT_REQUEST only (NULL otherwise): the request's new id, the
  // handler's from now on. Accept or reject it, then keep it for the
  // connection; destroy it with ibev_cm_id_destroy() in any case (destroying
  // it unanswered rejects the request). Its events go to the listener's
  // function and context, with `id` this new id.
  ibev_cm_id *new_id;
  const void *private_data;  // the peer's (NULL when none), valid during the call
  size_t private_data_length;
};

typedef void (*ibev_cm_event_fn)(const struct ibev_cm_event *event, void *context);

// An rdma_cm_id (RDMA_PS_TCP) on `channel`, whose events `on_event` hears on
// the dispatching thread, as the kernel's rdma_create_id takes its
// event_handler. The id keeps its channel (destroying the ibev_cm_channel
// before the id is fine). EINVAL for a NULL channel or handler; errno of
// rdma_create_id.
ibev_cm_id *ibev_cm_id_create(ibev_cm_channel *channel, ibev_cm_event_fn on_event,
                              void *context);
// Destroys the id (rdma_destroy_id): its handler is detached first and the
// call returns once it is not running (at once from inside its own
// handler, which may destroy its id); then `context` may be freed. A
// connected peer hears DISCONNECTED; the QP given to connect or accept is
// not destroyed, only let go. NULL and a lent id are ignored.
void ibev_cm_id_destroy(ibev_cm_id *id);

// Every call below may be made from any thread, handlers included. Each
// returns 0 or an errno value with ibev_last_error() naming it and the
// librdmacm call that failed; EINVAL for a NULL id, a lent id, or bad input.

// rdma_resolve_addr from `source_host` (NULL: any) to `host` and `port`
// (numeric IPv4 or IPv6 addresses): ADDR_RESOLVED (or ADDR_ERROR) follows.
int ibev_cm_id_resolve_addr(ibev_cm_id *id, const char *source_host, const char *host,
                            uint16_t port, int timeout_ms);
// rdma_resolve_route: ROUTE_RESOLVED (or ROUTE_ERROR) follows.
int ibev_cm_id_resolve_route(ibev_cm_id *id, int timeout_ms);
// rdma_bind_addr to `host` ("::" or "0.0.0.0": any) and `port` (0: any free
// one, ibev_cm_id_local_address() tells which), then rdma_listen:
// CONNECT_REQUESTs follow.
int ibev_cm_id_listen(ibev_cm_id *id, const char *host, uint16_t port, int backlog);

// What connect and accept send (rdma_conn_param, CmConnectOptions). Start
// from ibev_cm_connect_attr_init().
struct ibev_cm_connect_attr {
  const void *private_data;  // a request's: 56 bytes at most; a reply's: 196
  size_t private_data_length;
  // 0..255, or -1: librdmacm's default (the device's maximum; on accept the
  // least of the peer's request and the device's maximum).
  int responder_resources;
  int initiator_depth;
  uint8_t retry_count;
  uint8_t rnr_retry_count;  // 7: for ever
};
// CmConnectOptions' defaults: no private data, depths -1, retries 7.
void ibev_cm_connect_attr_init(struct ibev_cm_connect_attr *attr);

// Sends the connection request for `qp` (an RC QP on the id's device, once
// the route is resolved; ibev takes it to INIT if it is not): ESTABLISHED
// (QP in RTS), REJECTED, UNREACHABLE or CONNECT_ERROR follows. `attr` NULL:
// the defaults. The id keeps a reference to the QP; the ibev_qp stays the
// caller's.
int ibev_cm_id_connect(ibev_cm_id *id, ibev_qp *qp, const struct ibev_cm_connect_attr *attr);
// On a CONNECT_REQUEST's new id: takes `qp` to RTS and replies; ESTABLISHED
// follows when the peer's RTU comes. `attr` as ibev_cm_id_connect()'s.
int ibev_cm_id_accept(ibev_cm_id *id, ibev_qp *qp, const struct ibev_cm_connect_attr *attr);
// On a CONNECT_REQUEST's new id: the peer hears REJECTED with these
// `length` bytes (255 at most; `data` may be NULL for 0).
int ibev_cm_id_reject(ibev_cm_id *id, const void *data, size_t length);
// Moves the QP to ERR and sends the disconnect: the peer hears
// DISCONNECTED and should call this too (on DISCONNECTED, as rping does),
// which answers; then this side hears DISCONNECTED.
int ibev_cm_id_disconnect(ibev_cm_id *id);

// The port it is bound to, from 1; 0 before that, or with errno set (EINVAL
// for a NULL id).
int ibev_cm_id_port_num(const ibev_cm_id *id);
// Its local or its peer's address as text ("10.0.0.1:7471",
// "[fd00::1]:7471"), written into the caller's buffer as snprintf writes
// (ibev_write_metrics() says how: `length`, if not NULL, gets the whole
// text's length). EINVAL for a NULL id, or a NULL buffer with a size above 0.
int ibev_cm_id_local_address(const ibev_cm_id *id, char *buffer, size_t size, size_t *length);
int ibev_cm_id_peer_address(const ibev_cm_id *id, char *buffer, size_t size, size_t *length);

// One attempt's QP: an RC QP on ibev_cm_id_device_name()'s device, its CQs
// served by the channel's dispatcher, in INIT (ibev_cm_id_init_qp()) with
// its receives posted. ibev takes the returned ibev_qp (do not destroy it);
// NULL fails the attempt (with errno and ibev_last_error() saying why), and
// the next is scheduled. Runs on the dispatching thread or the health's
// executor; `attempt` is the recovery attempt (its undelivered wr_ids).
// The QP receives before the session runs on it (accepted, from the REP on;
// until the attempt times out when the RTU is lost): repost its receives as
// they complete there too (cm/cm_session.h's MakeQp says why).
typedef ibev_qp *(*ibev_make_qp_fn)(const ibev_cm_id *id, const ibev_recovery_attempt *attempt,
                                    void *context);

// A session's options. Start from ibev_cm_session_attr_init(). `health`
// gives the keepalive, deadline, executor and recovery policy; its port,
// initial state, mode, connect and reconnect are the session's own.
struct ibev_cm_session_attr {
  uint64_t id;  // nonzero: how the acceptor knows this session again
  ibev_make_qp_fn make_qp;
  void *make_qp_context;
  const void *private_data;  // the application's, after the session's id: 40 bytes at most
  size_t private_data_length;
  struct ibev_health_attr health;
  int resolve_timeout_ms;  // each of rdma_resolve_addr and rdma_resolve_route
  int connect_timeout_ms;  // an attempt's time from its new id to ESTABLISHED
};
void ibev_cm_session_attr_init(struct ibev_cm_session_attr *attr);

// The active side: connects to `host` (a numeric IPv4 or IPv6 address) and
// `port`; down until the CM says ESTABLISHED, then up. Its first connect is
// its first attempt, so a server not there yet is retried as a lost one is.
// `on_change` hears its health as ibev_health_create()'s handler does.
// EINVAL for a NULL channel, attr field or handler, an id 0, a host that
// is not a numeric address, a timeout not above 0, private data past 40
// bytes, or what ibev_health_create() refuses.
ibev_cm_session *ibev_cm_session_connect(ibev_cm_channel *channel, const char *host,
                                         uint16_t port, const struct ibev_cm_session_attr *attr,
                                         ibev_health_fn on_change, void *context);
// Closes it: its health (the handler waited for as ibev_health_destroy()
// says), then the CM id (the peer hears DISCONNECTED); the QP is let go.
// NULL is ignored.
void ibev_cm_session_destroy(ibev_cm_session *session);
// Its id (0 for NULL).
uint64_t ibev_cm_session_id(const ibev_cm_session *session);
// Its health, lent for the session's life (not to be destroyed): state,
// causes, completions, post_send and retry_now go through it. NULL for a
// NULL session.
ibev_health *ibev_cm_session_health(ibev_cm_session *session);

// An acceptor's options. Start from ibev_cm_acceptor_attr_init().
struct ibev_cm_acceptor_attr {
  ibev_make_qp_fn make_qp;
  void *make_qp_context;
  const void *private_data;  // the reply's: 196 bytes at most
  size_t private_data_length;
  // Every session's: policy.give_up_after_ms is how long one waits for its
  // peer to come back before it fails.
  struct ibev_health_attr health;
  int backlog;
  int connect_timeout_ms;  // from accepting a request to ESTABLISHED
};
void ibev_cm_acceptor_attr_init(struct ibev_cm_acceptor_attr *attr);

// A session new to the acceptor, not up yet: it is the callee's, to keep
// and destroy with ibev_cm_session_destroy() (destroying it at once closes
// it, and the peer is rejected). On the dispatching thread.
typedef void (*ibev_cm_session_fn)(ibev_cm_session *session, void *context);
// A change of the session with this id: every session of the acceptor
// reports here, as the health handler does.
typedef void (*ibev_cm_change_fn)(uint64_t id, const struct ibev_health_change *change,
                                  void *context);

// rdma_listen on `host` (a numeric address; "::" or "0.0.0.0": any) and
// `port` (0: any free one, ibev_cm_acceptor_port() tells which). A request naming a
// session of this acceptor is that session's next attempt; one naming none
// makes a new session (`on_session`). EINVAL for a NULL channel, host,
// attr field or callback, a host that is not a numeric address, a timeout
// not above 0; rdma_bind_addr's or rdma_listen's errno.
ibev_cm_acceptor *ibev_cm_acceptor_listen(ibev_cm_channel *channel, const char *host,
                                          uint16_t port, const struct ibev_cm_acceptor_attr *attr,
                                          ibev_cm_session_fn on_session,
                                          ibev_cm_change_fn on_change, void *context);
// Stops listening (on_session returns first); the sessions go on, each
// its keeper's, and each still reports to on_change with `context`: keep
// `context` until the last session it gave is destroyed. NULL is ignored.
void ibev_cm_acceptor_destroy(ibev_cm_acceptor *acceptor);
// The port it listens on (0 for NULL; 0 with errno ENODEV once its listener
// was closed under it, its device removed).
uint16_t ibev_cm_acceptor_port(const ibev_cm_acceptor *acceptor);
// The sessions it knows by id: neither failed nor closed (0 for NULL).
size_t ibev_cm_acceptor_sessions(const ibev_cm_acceptor *acceptor);

// ------------------------------------------------------------------ replay

// A recording (what `ibev-watch --json` writes, docs/operations.md) played
// into a dispatcher through ibev_dispatcher_inject(), as ibev::Replay
// (dispatch/replay.h): the application's own handlers hear, without RDMA
// hardware, what a real fabric did. A port or device event reaches the
// listeners of the device `device` maps the recorded name to (NULL: the
// event is skipped and counted); an object event reaches the handler of
// the ibev_qp whose qp_num is the recorded number, and one recorded with an
// address only is skipped; a device added or removed is counted, not
// replayed.
// Replayed events are synthesized, never acked to rdma-core.

// Maps a recorded device name ("rxe0") to a live device of this process:
// ibev_device_context() of the ibev_device opened for it, or NULL to skip
// its events. Runs on the thread calling ibev_replay_play_file().
typedef struct ibv_context *(*ibev_replay_device_fn)(const char *recorded_name, void *context);

// Start from ibev_replay_attr_init().
struct ibev_replay_attr {
  double speed;  // 1: the recorded pace; 0: back to back; else 1e-6 to 1e6
  ibev_replay_device_fn device;
  void *context;  // the device function's
};
void ibev_replay_attr_init(struct ibev_replay_attr *attr);

struct ibev_replay_stats {
  size_t injected;  // events handed to the dispatcher
  size_t skipped;   // events with no live device or object
  size_t changes;   // devices added or removed in the recording
  int stopped;      // nonzero: ibev_replay_stop() ended it
};

// A replay into `dispatcher`, which must outlive it. EINVAL for a NULL
// dispatcher or attr, no device function, or a speed out of range.
ibev_replay *ibev_replay_create(ibev_dispatcher *dispatcher, const struct ibev_replay_attr *attr);
// Must not race ibev_replay_play_file() (stop it, and let it return, first).
// NULL is ignored.
void ibev_replay_destroy(ibev_replay *replay);
// Reads the recording at `path` whole, then injects its events at their
// recorded distance from the first line's time, divided by the speed, and
// returns once the last is injected (not delivered: handlers run on the
// dispatching thread, in order). `stats` (if not NULL) gets what it did.
// Blocks its caller: with a speed above 0 never call it on the dispatching
// thread (a handler, or the thread driving run_once()), as nothing would
// be delivered while it waits. EINVAL for a NULL replay or path and for a
// recording the reader refuses (ibev_last_error() says "PATH:LINE: why");
// open's errno for a file that cannot be read.
int ibev_replay_play_file(ibev_replay *replay, const char *path, struct ibev_replay_stats *stats);
// From any thread: a play in progress returns at once (stats.stopped set),
// and so does every later one. NULL is ignored.
void ibev_replay_stop(ibev_replay *replay);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // IBEV_IBEV_C_H_
