// A C program that uses ibev as a C RDMA project would (<ibev/ibev_c.h>),
// built with no C++ in its build: gcc -std=c11 -Wall -Wextra -Werror
// (examples/consumer-c/Makefile, through pkg-config), and by ibev's own
// suite (examples/consumer-c/BUILD.bazel).
//
//   consumer-c          routes injected events to a QP handler and a port
//                       listener; bad input gets an errno and a message
//   consumer-c --rdma   then, on a real device (IBEV_TEST_DEVICE, or the
//                       first one): a device client hears it added, two RC
//                       QPs exchange their endpoints in ibv_rc_pingpong's
//                       form and play ping-pong from the CQ's completion
//                       handler on the dispatcher thread, a device listener
//                       and a waiter hear their events, and a drain flushes
//                       what is left
//
// Prints what it checked and "N passed, N failed"; exits 0 when all passed.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <ibev/ibev_c.h>
#include <ibev/version.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int passed, failed;

static void check(int ok, const char *what) {
  printf("%s: %s\n", ok ? "ok" : "FAILED", what);
  if (ok) {
    ++passed;
  } else {
    ++failed;
    if (ibev_last_error()[0] != '\0') printf("  last error: %s\n", ibev_last_error());
  }
}

// Whether `*value` reached `target` within `seconds` (the handlers run on
// the dispatcher thread; this one only watches).
static int reaches(atomic_int *value, int target, int seconds) {
  const struct timespec pause = {0, 1000000};
  for (long waited = 0; waited < seconds * 1000L; ++waited) {
    if (atomic_load(value) >= target) return 1;
    nanosleep(&pause, NULL);
  }
  return atomic_load(value) >= target;
}

struct heard {
  atomic_int comm_est;
  atomic_int port_err;
  atomic_int other;
  atomic_int failures;
};

static void on_qp_event(const struct ibev_event *event, void *context) {
  struct heard *heard = context;
  if (event->code == IBV_EVENT_COMM_EST && event->qp != NULL) {
    atomic_fetch_add(&heard->comm_est, 1);
  } else {
    atomic_fetch_add(&heard->other, 1);
  }
}

static void on_port_event(const struct ibev_event *event, void *context) {
  struct heard *heard = context;
  if (event->code == IBV_EVENT_PORT_ERR && event->port == 1 &&
      event->element_kind == IBEV_ELEMENT_PORT) {
    atomic_fetch_add(&heard->port_err, 1);
  } else {
    atomic_fetch_add(&heard->other, 1);
  }
}

static void on_failure(const struct ibev_failure *failure, void *context) {
  struct heard *heard = context;
  printf("failure: %s\n", failure->description);
  atomic_fetch_add(&heard->failures, 1);
}

// A QP handler and a port listener each hear exactly their injected event;
// bad input is an error code and a message.
static void route_injected_events(void) {
  struct heard heard = {0};
  struct ibev_dispatcher_attr attr = {0};
  attr.on_failure = on_failure;
  attr.failure_context = &heard;
  ibev_dispatcher *dispatcher = ibev_dispatcher_create(&attr);
  check(dispatcher != NULL, "ibev_dispatcher_create");
  if (dispatcher == NULL) return;

  struct ibv_context device;  // stand-ins: only their addresses are used here
  struct ibv_qp qp;
  const int port_err = IBV_EVENT_PORT_ERR;
  const struct ibev_filter only_port_err = {&port_err, 1, 0};
  ibev_handle *on_qp = ibev_attach(dispatcher, IBEV_ELEMENT_QP, &qp, NULL, on_qp_event, &heard);
  ibev_handle *on_port = ibev_listen(dispatcher, &device, &only_port_err, on_port_event, &heard);
  check(on_qp != NULL && on_port != NULL, "ibev_attach and ibev_listen");

  struct ibv_async_event comm_est = {.event_type = IBV_EVENT_COMM_EST};
  comm_est.element.qp = &qp;
  struct ibv_async_event port_down = {.event_type = IBV_EVENT_PORT_ERR};
  port_down.element.port_num = 1;
  struct ibv_async_event port_up = {.event_type = IBV_EVENT_PORT_ACTIVE};  // not in the filter
  port_up.element.port_num = 1;
  check(ibev_dispatcher_inject(dispatcher, &device, &comm_est) == 0 &&
            ibev_dispatcher_inject(dispatcher, &device, &port_down) == 0 &&
            ibev_dispatcher_inject(dispatcher, &device, &port_up) == 0,
        "ibev_dispatcher_inject");
  size_t served = 0;
  check(ibev_dispatcher_run_once(dispatcher, 1000, &served) == 0 && served > 0,
        "ibev_dispatcher_run_once served the injected events");
  check(atomic_load(&heard.comm_est) == 1, "the QP handler heard COMM_EST once");
  check(atomic_load(&heard.port_err) == 1, "the port listener heard PORT_ERR once");
  check(atomic_load(&heard.other) == 0, "nobody heard what their filter left out");

  // Bad input: an errno and a message naming the call, never a crash.
  struct ibv_async_event no_qp = {.event_type = IBV_EVENT_COMM_EST};
  check(ibev_dispatcher_inject(dispatcher, &device, &no_qp) == EINVAL &&
            strstr(ibev_last_error(), "ibev_dispatcher_inject") != NULL,
        "a QP event naming no QP is EINVAL");
  printf("  (%s)\n", ibev_last_error());
  errno = 0;
  check(ibev_device_open(dispatcher, "no-such-device") == NULL && errno == ENODEV &&
            strstr(ibev_last_error(), "ibev_device_open") != NULL,
        "a device that is not there is ENODEV");
  printf("  (%s)\n", ibev_last_error());
  check(ibev_attach(dispatcher, IBEV_ELEMENT_QP, NULL, NULL, on_qp_event, &heard) == NULL &&
            errno == EINVAL,
        "attaching to no object is EINVAL");

  ibev_handle_release(on_port);
  ibev_handle_release(on_qp);
  ibev_dispatcher_destroy(dispatcher);
  check(atomic_load(&heard.failures) == 0, "no failure was reported");
}

// ------------------------------------------------------------------ RDMA

enum { kRoundTrips = 100, kSlot = 64 };

// Two QPs on one CQ: a sends, b answers, a counts a round trip and sends
// again, all from the completion handler.
struct pingpong {
  struct ibv_qp *a, *b;
  uint32_t lkey;
  char *buffer;  // a's receive slot, b's, a's send slot, b's
  atomic_int round_trips;
  atomic_int errors;
  atomic_int draining;
  atomic_int flushed;
};

static int post_receive(struct ibv_qp *qp, char *at, uint32_t lkey) {
  struct ibv_sge sge = {(uintptr_t)at, kSlot, lkey};
  struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1};
  struct ibv_recv_wr *bad = NULL;
  return ibv_post_recv(qp, &wr, &bad);
}

static int post_send(struct ibv_qp *qp, char *at, uint32_t lkey) {
  struct ibv_sge sge = {(uintptr_t)at, kSlot, lkey};
  struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND};
  struct ibv_send_wr *bad = NULL;
  return ibv_post_send(qp, &wr, &bad);
}

static void on_completions(struct ibv_cq *cq, const struct ibv_wc *wc, size_t count,
                           void *context) {
  (void)cq;
  struct pingpong *pp = context;
  char *const receive_a = pp->buffer, *const receive_b = pp->buffer + kSlot;
  char *const send_a = pp->buffer + 2 * kSlot, *const send_b = pp->buffer + 3 * kSlot;
  for (size_t i = 0; i < count; ++i) {
    if (wc[i].status != IBV_WC_SUCCESS) {
      if (atomic_load(&pp->draining) && wc[i].status == IBV_WC_WR_FLUSH_ERR) {
        atomic_fetch_add(&pp->flushed, 1);
      } else {
        printf("completion error: %s\n", ibv_wc_status_str(wc[i].status));
        atomic_fetch_add(&pp->errors, 1);
      }
      continue;
    }
    if (wc[i].opcode != IBV_WC_RECV) continue;  // a send's (every send is signaled)
    if (wc[i].qp_num == pp->b->qp_num) {
      snprintf(send_b, kSlot, "pong %.50s", receive_b);
      if (post_receive(pp->b, receive_b, pp->lkey) != 0 ||
          post_send(pp->b, send_b, pp->lkey) != 0) {
        atomic_fetch_add(&pp->errors, 1);
      }
    } else {
      // a's receive is posted again even after the last round trip: the
      // drain below has it to flush.
      const int good = strncmp(receive_a, "pong ping ", 10) == 0;
      const int done = atomic_fetch_add(&pp->round_trips, good) + good;
      snprintf(send_a, kSlot, "ping %d", done);
      if (!good || post_receive(pp->a, receive_a, pp->lkey) != 0 ||
          (done < kRoundTrips && post_send(pp->a, send_a, pp->lkey) != 0)) {
        atomic_fetch_add(&pp->errors, 1);
      }
    }
  }
}

struct added {
  atomic_int count;
  char name[64];
};

static void on_add(ibev_device *device, void *context) {
  struct added *added = context;
  snprintf(added->name, sizeof added->name, "%s", ibev_device_name(device));
  atomic_fetch_add(&added->count, 1);
}

static void on_remove(ibev_device *device, enum ibev_device_loss loss, void *context) {
  (void)device, (void)loss, (void)context;
}

static void rdma(void) {
  const char *name = getenv("IBEV_TEST_DEVICE");
  struct heard heard = {0};
  struct ibev_dispatcher_attr attr = {0};
  attr.on_failure = on_failure;
  attr.failure_context = &heard;
  ibev_dispatcher *dispatcher = ibev_dispatcher_create(&attr);
  ibev_device *device = ibev_device_open(dispatcher, name);
  check(device != NULL, "ibev_device_open");
  if (device == NULL) {
    ibev_dispatcher_destroy(dispatcher);
    return;
  }
  struct added added = {0};
  ibev_clients *clients = NULL;
  ibev_handle *registered = NULL;
  static char buffer[4 * kSlot];
  struct pingpong pp = {.buffer = buffer};
  ibev_pd *pd = ibev_pd_create(device);
  ibev_mr *mr = ibev_mr_create(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE);
  ibev_cq *cq = ibev_cq_create(device, NULL, on_completions, NULL, &pp);
  struct ibev_qp_attr qp_attr = {.send_cq = cq, .recv_cq = cq, .sq_sig_all = 1};
  ibev_qp *a = ibev_qp_create(pd, &qp_attr, on_qp_event, &heard);
  ibev_qp *b = ibev_qp_create(pd, &qp_attr, on_qp_event, &heard);
  check(pd != NULL && mr != NULL && cq != NULL && a != NULL && b != NULL,
        "PD, MR, CQ and two QPs, each with its handler");
  if (a == NULL || b == NULL || mr == NULL) goto out;
  pp.a = ibev_qp_get(a);
  pp.b = ibev_qp_get(b);
  pp.lkey = ibev_mr_get(mr)->lkey;

  // Started once what its handlers read is written (the thread's start is
  // what orders those writes before them), and before anything is posted to
  // it: a client's add, below, is served at once. Started after the rest of
  // the set-up instead, the add would wait, and a set-up slower than the
  // watchdog's second would be reported as events undispatched.
  check(ibev_dispatcher_start(dispatcher) == 0, "ibev_dispatcher_start");
  check(ibev_dispatcher_start(dispatcher) == EINVAL, "starting it twice is EINVAL");
  clients = ibev_clients_create(dispatcher);
  const struct ibev_client client = {"consumer-c", on_add, on_remove, &added};
  registered = ibev_clients_register(clients, &client);
  check(clients != NULL && registered != NULL, "ibev_clients_register");
  // However long the set-up below takes (here, longer than the watchdog's
  // second on purpose), nothing waits unserved: no failure is reported.
  const struct timespec slow_set_up = {1, 200 * 1000 * 1000};
  nanosleep(&slow_set_up, NULL);

  // The endpoints go through ibv_rc_pingpong's wire form, as between hosts.
  struct ibev_rc_endpoint ends[2], from_wire[2];
  char wire[2][IBEV_RC_ENDPOINT_WIRE_SIZE];
  check(ibev_qp_endpoint(a, 1, 0, &ends[0]) == 0 && ibev_qp_endpoint(b, 1, 0, &ends[1]) == 0 &&
            ibev_rc_endpoint_to_wire(&ends[0], wire[0]) == 0 &&
            ibev_rc_endpoint_to_wire(&ends[1], wire[1]) == 0 &&
            ibev_rc_endpoint_from_wire(wire[0], sizeof wire[0], &from_wire[0]) == 0 &&
            ibev_rc_endpoint_from_wire(wire[1], sizeof wire[1], &from_wire[1]) == 0 &&
            from_wire[0].qp_num == pp.a->qp_num && from_wire[1].psn == ends[1].psn,
        "the endpoints survive ibv_rc_pingpong's wire form");
  printf("  a: %s\n", wire[0]);
  check(
      ibev_qp_connect(a, &from_wire[1], NULL) == 0 && ibev_qp_connect(b, &from_wire[0], NULL) == 0,
      "ibev_qp_connect, both ways");
  check(ibev_rc_endpoint_from_wire("not an endpoint", 15, &from_wire[0]) == EINVAL,
        "a malformed endpoint is EINVAL");

  // Armed before the events are made (injected below).
  const int port_err = IBV_EVENT_PORT_ERR, comm_est = IBV_EVENT_COMM_EST,
            sq_drained = IBV_EVENT_SQ_DRAINED;
  const struct ibev_filter only_port_err = {&port_err, 1, 1};
  const struct ibev_filter only_comm_est = {&comm_est, 1, 0};
  const struct ibev_filter only_sq_drained = {&sq_drained, 1, 0};
  ibev_handle *listener = ibev_device_listen(device, &only_port_err, on_port_event, &heard);
  ibev_waiter *established = ibev_wait_for(dispatcher, IBEV_ELEMENT_QP, pp.a, &only_comm_est, 5000);
  ibev_waiter *never = ibev_wait_for(dispatcher, IBEV_ELEMENT_QP, pp.a, &only_sq_drained, 100);
  check(listener != NULL && established != NULL && never != NULL,
        "a device listener and two waiters");
  check(reaches(&added.count, 1, 10) && strcmp(added.name, ibev_device_name(device)) == 0,
        "the device client's add heard the device");

  check(
      post_receive(pp.a, buffer, pp.lkey) == 0 && post_receive(pp.b, buffer + kSlot, pp.lkey) == 0,
      "ibv_post_recv on both");
  snprintf(buffer + 2 * kSlot, kSlot, "ping 0");
  check(post_send(pp.a, buffer + 2 * kSlot, pp.lkey) == 0, "ibv_post_send");
  check(reaches(&pp.round_trips, kRoundTrips, 30), "100 round trips, driven by the CQ handler");
  check(atomic_load(&pp.errors) == 0, "no completion error, every message intact");

  struct ibv_async_event port_down = {.event_type = IBV_EVENT_PORT_ERR};
  port_down.element.port_num = 1;
  struct ibv_async_event up = {.event_type = IBV_EVENT_COMM_EST};
  up.element.qp = pp.a;
  check(ibev_dispatcher_inject(dispatcher, ibev_device_context(device), &port_down) == 0 &&
            ibev_dispatcher_inject(dispatcher, ibev_device_context(device), &up) == 0,
        "inject PORT_ERR and COMM_EST on the real device");
  enum ibev_wait_outcome outcome = IBEV_WAIT_TIMED_OUT;
  struct ibev_event event;
  check(ibev_waiter_wait(established, &outcome, &event) == 0 && outcome == IBEV_WAIT_EVENT &&
            event.qp == pp.a && event.code == IBV_EVENT_COMM_EST,
        "the waiter heard COMM_EST of its QP");
  check(ibev_waiter_wait(never, &outcome, NULL) == 0 && outcome == IBEV_WAIT_TIMED_OUT,
        "a waiter for an event that never comes times out");
  check(reaches(&heard.port_err, 1, 10), "the device listener heard PORT_ERR on port 1");
  check(reaches(&heard.comm_est, 1, 10), "a's own handler heard COMM_EST too");

  // Receives are posted on both; the drain flushes a's, b's stays.
  atomic_store(&pp.draining, 1);
  struct ibev_drain_report report = {0};
  check(ibev_qp_drain(a, 0, &report) == 0 && report.send_drained && report.receive_drained &&
            report.last_wqe_reached == -1,
        "ibev_qp_drain: both queues");
  check(atomic_load(&pp.flushed) >= 1,
        "the CQ handler had the flushed receive before the drain returned");

  ibev_waiter_destroy(never);
  ibev_waiter_destroy(established);
  ibev_handle_release(listener);
out:
  // rdma-core's order (QPs, the CQ, the MR and PD, the device): each
  // destroy then ends its rdma-core object at once, its handler finished.
  ibev_qp_destroy(a);
  ibev_qp_destroy(b);
  ibev_cq_destroy(cq);
  ibev_mr_destroy(mr);
  ibev_pd_destroy(pd);
  ibev_device_destroy(device);
  ibev_handle_release(registered);
  ibev_clients_destroy(clients);
  ibev_dispatcher_stop(dispatcher);
  ibev_dispatcher_destroy(dispatcher);
  check(atomic_load(&heard.failures) == 0, "no failure was reported");
  check(atomic_load(&heard.other) == 0, "no handler heard an event it did not ask for");
}

int main(int argc, char **argv) {
  printf("ibev %s, from C\n", IBEV_VERSION_STRING);
  route_injected_events();
  if (argc > 1 && strcmp(argv[1], "--rdma") == 0) rdma();
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
