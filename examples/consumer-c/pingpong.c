// ibev-c-pingpong: two processes, one RC connection, a message back and
// forth ITERS times, that heals: when the connection goes down (a link
// flap: PORT_ERR), its health (ibev_health_*) waits for the port, drains
// and resets the QP in place, and hands this program a recovery attempt;
// the program posts its receives again, swaps the new endpoints with its
// peer over the same TCP connection, connects the attempt, and the client
// sends again the message that was lost. Plain C11 against <ibev/ibev_c.h>.
//
//   ibev-c-pingpong [-d DEVICE] [-g GID_INDEX] [-p TCP_PORT] [-n ITERS]
//                   [-i INTERVAL_MS] [-t SECONDS] [SERVER]
//
// Without SERVER it waits for one client on TCP_PORT (default 18515); with
// it, it connects to SERVER:TCP_PORT and sends first. -i waits that long
// between the client's messages (default 0), so that a run spans a flap.
// Exits 0 after ITERS messages each way, printing "ITERS iters in S s,
// healed H times"; 1, saying why on stderr, on any error, when the
// connection failed for good, or when the run takes longer than -t
// (default 30 s); 2 for a usage error.
//
// Threads: the dispatcher's runs the completion function (which hands each
// completion to the health and notes a message); an ibev_worker runs the
// health's handler, its reconnect function (which blocks on the peer's
// socket without holding up completions) and the server's replies; the
// client's main sends, and waits.
// Endpoints are swapped in ibv_rc_pingpong's order and wire form: the
// client writes its endpoint first, the server connects before it answers,
// so neither side's first message finds its peer short of RTR.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <ibev/ibev_c.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { kReceives = 4, kMessage = sizeof(uint32_t) };

struct args {
  const char *device;  // NULL: the first
  int gid_index;
  const char *tcp_port;
  long iters;
  long interval_ms;
  long timeout_s;
  const char *server;  // NULL: we are the server
};

// What the threads share, under `mutex`; `changed` is signaled on every
// change of it.
struct pingpong {
  struct args args;
  struct timespec deadline;
  int sock;
  ibev_qp *qp;
  ibev_mr *mr;
  ibev_worker *worker;
  // Set once the QP is first connected, before its endpoint goes to the
  // peer: so before any completion can come.
  _Atomic(ibev_health *) health;
  // [0]: the message sent; [1 + i]: receive slot i.
  uint32_t buffer[1 + kReceives];

  pthread_mutex_t mutex;
  pthread_cond_t changed;
  enum ibev_connection_state state;
  long heals;
  uint32_t current;  // client: the message waiting for its reply
  int replied;       // client: the reply to `current` came
  int done;          // server: the last reply was delivered
  int drained;       // the worker ran every task posted before the end
};

static void die(const char *fmt, ...) {
  va_list list;
  va_start(list, fmt);
  fprintf(stderr, "ibev-c-pingpong: ");
  vfprintf(stderr, fmt, list);
  fprintf(stderr, "\n");
  va_end(list);
  exit(1);
}

static void die_ibev(const char *what) {
  die("%s: %s", what, ibev_last_error()[0] != '\0' ? ibev_last_error() : strerror(errno));
}

static void usage(const char *argv0, int status) {
  fprintf(status == 0 ? stdout : stderr,
          "usage: %s [-d DEVICE] [-g GID_INDEX] [-p TCP_PORT] [-n ITERS] [-i INTERVAL_MS] "
          "[-t SECONDS] [SERVER]\n",
          argv0);
  exit(status);
}

static long number(const char *text, long min, const char *argv0) {
  char *end = NULL;
  const long value = strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < min || value > (1L << 30)) usage(argv0, 2);
  return value;
}

static long ms_left(const struct timespec *deadline) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const long left = (deadline->tv_sec - now.tv_sec) * 1000L +
                    (deadline->tv_nsec - now.tv_nsec) / 1000000L;
  return left > 0 ? left : 0;
}

// ------------------------------------------------------------ the TCP side

// Whole writes and reads; a read waits no longer than the run's deadline.
static int write_all(int fd, const void *data, size_t size) {
  for (const char *at = data; size > 0;) {
    const ssize_t n = write(fd, at, size);
    if (n < 0) return -1;
    at += n;
    size -= (size_t)n;
  }
  return 0;
}

static int read_all(int fd, void *data, size_t size, const struct timespec *deadline) {
  for (char *at = data; size > 0;) {
    struct pollfd ready = {fd, POLLIN, 0};
    const int polled = poll(&ready, 1, (int)ms_left(deadline));
    if (polled == 0) errno = ETIMEDOUT;
    if (polled <= 0) return -1;
    const ssize_t n = read(fd, at, size);
    if (n == 0) errno = ECONNRESET;
    if (n <= 0) return -1;
    at += n;
    size -= (size_t)n;
  }
  return 0;
}

static int tcp_socket(const struct args *args, const struct timespec *deadline) {
  struct addrinfo hints, *found = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = args->server == NULL ? AI_PASSIVE : 0;
  const int error = getaddrinfo(args->server, args->tcp_port, &hints, &found);
  if (error != 0) die("getaddrinfo %s: %s", args->tcp_port, gai_strerror(error));
  int fd = -1;
  if (args->server == NULL) {
    fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, 1) != 0) {
      die("listen on %s: %s", args->tcp_port, strerror(errno));
    }
    struct pollfd ready = {fd, POLLIN, 0};
    if (poll(&ready, 1, (int)ms_left(deadline)) <= 0) die("accept: no client came: timed out");
    const int client = accept(fd, NULL, NULL);
    if (client < 0) die("accept: %s", strerror(errno));
    close(fd);
    fd = client;
  } else {
    // The server may not listen yet: try again until the deadline.
    const struct timespec pause = {0, 100000000};
    for (;;) {
      fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
      if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) break;
      if (fd >= 0) close(fd);
      if (ms_left(deadline) == 0) die("connect to %s:%s: %s", args->server, args->tcp_port,
                                      strerror(errno));
      nanosleep(&pause, NULL);
    }
  }
  freeaddrinfo(found);
  return fd;
}

// ---------------------------------------------------------- the RDMA side

static int post_receive(struct pingpong *p, int slot) {
  struct ibv_sge sge = {(uintptr_t)&p->buffer[1 + slot], kMessage, ibev_mr_get(p->mr)->lkey};
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = (uint64_t)slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(ibev_qp_get(p->qp), &wr, &bad);
}

// The message `seq`, through the health: ENOTCONN while it is not up (the
// client sends it again once it is; the server's reply is asked again).
static int send_message(struct pingpong *p, uint32_t seq) {
  struct ibv_sge sge = {(uintptr_t)&p->buffer[0], kMessage, ibev_mr_get(p->mr)->lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = seq;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  p->buffer[0] = seq;
  return ibev_health_post_send(atomic_load(&p->health), &wr, NULL);
}

// The QP in INIT with its receives posted, its endpoint swapped with the
// peer's in ibv_rc_pingpong's order; `connect` then takes it to RTS (the
// server's before it answers). 0, or an errno with `why` set.
typedef int (*connect_fn)(void *with, const struct ibev_rc_endpoint *remote);

static int swap_and_connect(struct pingpong *p, const struct ibev_rc_endpoint *local,
                            connect_fn connect_to, void *with, const char **why) {
  *why = "ibev_qp_to_init";
  int error = ibev_qp_to_init(p->qp, NULL);
  for (int slot = 0; error == 0 && slot < kReceives; ++slot) {
    *why = "ibv_post_recv";
    error = post_receive(p, slot);
  }
  if (error != 0) return error;
  char mine[IBEV_RC_ENDPOINT_WIRE_SIZE], theirs[IBEV_RC_ENDPOINT_WIRE_SIZE];
  struct ibev_rc_endpoint remote;
  ibev_rc_endpoint_to_wire(local, mine);
  if (p->args.server != NULL) {
    *why = "writing our endpoint";
    if (write_all(p->sock, mine, sizeof mine) != 0) return errno;
  }
  *why = "reading the peer's endpoint";
  if (read_all(p->sock, theirs, sizeof theirs, &p->deadline) != 0) return errno;
  *why = "the peer's endpoint";
  error = ibev_rc_endpoint_from_wire(theirs, sizeof theirs, &remote);
  *why = "connecting";
  if (error == 0) error = connect_to(with, &remote);
  if (error == 0 && p->args.server == NULL) {
    *why = "writing our endpoint";
    if (write_all(p->sock, mine, sizeof mine) != 0) return errno;
  }
  return error;
}

static void on_health(const struct ibev_health_change *change, void *context);
static void on_reconnect(const struct ibev_recovery_attempt *attempt, void *context);

// The first connection: the QP to RTS, then its health watches it, with
// recovery in place (its handler and reconnect on the worker).
static int connect_first(void *context, const struct ibev_rc_endpoint *remote) {
  struct pingpong *p = context;
  struct ibev_health_attr attr;
  ibev_health_attr_init(&attr);
  attr.connect.gid_index = p->args.gid_index;
  int error = ibev_qp_connect(p->qp, remote, &attr.connect);
  if (error != 0) return error;
  attr.executor = p->worker;
  attr.policy.first_delay_ms = 50;
  attr.policy.max_delay_ms = 1000;
  attr.policy.give_up_after_ms = (int)(p->args.timeout_s * 1000);
  attr.reconnect = on_reconnect;
  attr.reconnect_context = p;
  ibev_health *health = ibev_health_create(p->qp, &attr, on_health, p);
  if (health == NULL) return errno;
  atomic_store(&p->health, health);
  return 0;
}

static int connect_attempt(void *attempt, const struct ibev_rc_endpoint *remote) {
  return ibev_recovery_attempt_connect(attempt, remote);
}

// ------------------------------------------------------- what ibev calls

// The server's reply, posted on the worker rather than here: a post can
// block in the kernel while the link is down (soft-RoCE's does, until the
// port is back), and the dispatching thread must stay free to read the
// PORT_ERR that takes the connection down.
struct reply {
  struct pingpong *p;
  uint32_t seq;
};

static void send_reply(void *context) {
  struct reply *reply = context;
  // ENOTCONN while down: the client asks again; EINVAL (no health) at the end.
  send_message(reply->p, reply->seq);
  free(reply);
}

static void reply_later(struct pingpong *p, uint32_t seq) {
  struct reply *reply = malloc(sizeof *reply);
  if (reply == NULL) return;  // no reply: the client asks again after a heal
  reply->p = p;
  reply->seq = seq;
  if (ibev_worker_post(p->worker, send_reply, reply) != 0) free(reply);
}

// The worker's last task: every task posted before it has run.
static void drained(void *context) {
  struct pingpong *p = context;
  pthread_mutex_lock(&p->mutex);
  p->drained = 1;
  pthread_cond_broadcast(&p->changed);
  pthread_mutex_unlock(&p->mutex);
}

// On the dispatcher's thread.
static void on_completions(struct ibv_cq *cq, const struct ibv_wc *wc, size_t count,
                           void *context) {
  (void)cq;
  struct pingpong *p = context;
  // What main set up after this CQ was made (the QP, the worker) was written
  // under the lock, on another thread: take it once to see it.
  pthread_mutex_lock(&p->mutex);
  pthread_mutex_unlock(&p->mutex);
  for (size_t i = 0; i < count; ++i) {
    // Every completion, flushes too: the recovery's drain waits for them.
    ibev_health_completion(atomic_load(&p->health), &wc[i]);
    if (wc[i].status != IBV_WC_SUCCESS) continue;
    if (wc[i].opcode == IBV_WC_RECV) {
      const int slot = (int)wc[i].wr_id;
      const uint32_t seq = p->buffer[1 + slot];
      post_receive(p, slot);  // a QP being reset refuses it; the attempt posts them all
      if (p->args.server == NULL) {
        pthread_mutex_lock(&p->mutex);
        if (seq == p->current) p->replied = 1;
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->mutex);
      } else {
        reply_later(p, seq);
      }
    } else if (p->args.server != NULL && wc[i].wr_id == (uint64_t)p->args.iters) {
      pthread_mutex_lock(&p->mutex);
      p->done = 1;  // the last reply reached the client
      pthread_cond_broadcast(&p->changed);
      pthread_mutex_unlock(&p->mutex);
    }
  }
}

static const char *state_name(enum ibev_connection_state state) {
  switch (state) {
    case IBEV_CONNECTION_UP: return "up";
    case IBEV_CONNECTION_DOWN: return "down";
    case IBEV_CONNECTION_RECOVERING: return "recovering";
    case IBEV_CONNECTION_FAILED: return "failed";
  }
  return "?";
}

// On the worker's thread.
static void on_health(const struct ibev_health_change *change, void *context) {
  struct pingpong *p = context;
  printf("health: %s -> %s (%s)\n", state_name(change->from), state_name(change->to),
         change->cause.what[0] != '\0' ? change->cause.what : "no cause");
  fflush(stdout);
  pthread_mutex_lock(&p->mutex);
  p->state = change->to;
  if (change->from == IBEV_CONNECTION_RECOVERING && change->to == IBEV_CONNECTION_UP) ++p->heals;
  pthread_cond_broadcast(&p->changed);
  pthread_mutex_unlock(&p->mutex);
}

// On the worker's thread: the QP is drained and in RESET with a new PSN.
static void on_reconnect(const struct ibev_recovery_attempt *attempt, void *context) {
  struct pingpong *p = context;
  struct ibev_rc_endpoint local;
  const char *why = "ibev_recovery_attempt_local";
  int error = ibev_recovery_attempt_local(attempt, &local);
  if (error == 0) {
    error = swap_and_connect(p, &local, connect_attempt, (void *)attempt, &why);
  }
  printf("attempt %u: %s%s%s\n", ibev_recovery_attempt_number(attempt),
         error == 0 ? "connected" : why, error == 0 ? "" : ": ",
         error == 0 ? "" : strerror(error));
  fflush(stdout);
  // Failed: say so, and the next attempt comes (ignored if connect settled it).
  if (error != 0) ibev_recovery_attempt_fail(attempt, why);
}

// ------------------------------------------------------------------- main

static struct args parse(int argc, char **argv) {
  struct args args = {NULL, 0, "18515", 1000, 0, 30, NULL};
  for (int opt; (opt = getopt(argc, argv, "d:g:p:n:i:t:h")) != -1;) {
    switch (opt) {
      case 'd': args.device = optarg; break;
      case 'g': args.gid_index = (int)number(optarg, 0, argv[0]); break;
      case 'p': args.tcp_port = optarg; break;
      case 'n': args.iters = number(optarg, 1, argv[0]); break;
      case 'i': args.interval_ms = number(optarg, 0, argv[0]); break;
      case 't': args.timeout_s = number(optarg, 1, argv[0]); break;
      case 'h': usage(argv[0], 0); break;
      default: usage(argv[0], 2);
    }
  }
  if (optind + 1 < argc) usage(argv[0], 2);
  if (optind < argc) args.server = argv[optind];
  return args;
}

// Waits for `*flag` (or a connection failed for good, or the deadline),
// p->mutex held, as pthread_cond_timedwait needs:
// 0 when it came.
static int wait_for(struct pingpong *p, const int *flag, const char *what) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  const long left = ms_left(&p->deadline);
  until.tv_sec += left / 1000;
  until.tv_nsec += (left % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec += 1;
    until.tv_nsec -= 1000000000L;
  }
  int error = 0;
  while (!*flag && p->state != IBEV_CONNECTION_FAILED && error == 0) {
    error = pthread_cond_timedwait(&p->changed, &p->mutex, &until);
  }
  if (*flag) return 0;
  fprintf(stderr, "ibev-c-pingpong: %s: %s\n", what,
          p->state == IBEV_CONNECTION_FAILED ? "the connection failed for good" : "timed out");
  return 1;
}

// Waits `ms` milliseconds, as ping -i does, whatever signals interrupt it
// (a library's threads may use some).
static void pace(long ms) {
  struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
}

// The client's part: each message until its reply comes, sent again after
// the connection healed if it was lost.
static int play_client(struct pingpong *p) {
  pthread_mutex_lock(&p->mutex);
  for (uint32_t seq = 1; seq <= (uint32_t)p->args.iters; ++seq) {
    p->current = seq;
    p->replied = 0;
    while (!p->replied) {
      const int up = p->state == IBEV_CONNECTION_UP;
      const long heals = p->heals;
      if (up && send_message(p, seq) == 0) {
        // The reply, or the next heal (the message or its reply was lost).
        while (!p->replied && p->heals == heals && p->state != IBEV_CONNECTION_FAILED &&
               ms_left(&p->deadline) > 0) {
          struct timespec tick;
          clock_gettime(CLOCK_MONOTONIC, &tick);
          tick.tv_sec += 1;
          pthread_cond_timedwait(&p->changed, &p->mutex, &tick);
        }
      } else {  // down: wait for the heal
        struct timespec tick;
        clock_gettime(CLOCK_MONOTONIC, &tick);
        tick.tv_sec += 1;
        pthread_cond_timedwait(&p->changed, &p->mutex, &tick);
      }
      if (p->state == IBEV_CONNECTION_FAILED || ms_left(&p->deadline) == 0) {
        const int failed = wait_for(p, &p->replied, "waiting for a reply");  // under the lock
        pthread_mutex_unlock(&p->mutex);
        return failed;
      }
    }
    if (p->args.interval_ms > 0) {
      pthread_mutex_unlock(&p->mutex);
      pace(p->args.interval_ms);
      pthread_mutex_lock(&p->mutex);
    }
  }
  pthread_mutex_unlock(&p->mutex);
  return 0;
}

int main(int argc, char **argv) {
  static struct pingpong p;
  p.args = parse(argc, argv);
  clock_gettime(CLOCK_MONOTONIC, &p.deadline);
  p.deadline.tv_sec += p.args.timeout_s;
  p.state = IBEV_CONNECTION_UP;
  pthread_condattr_t monotonic;
  pthread_condattr_init(&monotonic);
  pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
  pthread_cond_init(&p.changed, &monotonic);
  pthread_mutex_init(&p.mutex, NULL);
  struct timespec started;
  clock_gettime(CLOCK_MONOTONIC, &started);

  // One device, opened by name: no device monitor (devices coming and
  // going are not this program's concern).
  struct ibev_dispatcher_attr dispatcher_attr;
  memset(&dispatcher_attr, 0, sizeof dispatcher_attr);
  dispatcher_attr.device_monitor = IBEV_DEVICE_MONITOR_OFF;
  ibev_dispatcher *dispatcher = ibev_dispatcher_create(&dispatcher_attr);
  if (dispatcher == NULL || ibev_dispatcher_start(dispatcher) != 0) die_ibev("dispatcher");
  ibev_device *device = ibev_device_open(dispatcher, p.args.device);
  if (device == NULL) die_ibev(p.args.device != NULL ? p.args.device : "the first device");
  ibev_pd *pd = ibev_pd_create(device);
  if (pd == NULL) die_ibev("ibev_pd_create");
  // The CQ's handler, on the dispatcher's thread, reads what is set up from
  // here on: it is written under the lock (on_completions takes it first).
  pthread_mutex_lock(&p.mutex);
  p.mr = ibev_mr_create(pd, p.buffer, sizeof p.buffer, IBV_ACCESS_LOCAL_WRITE);
  if (p.mr == NULL) die_ibev("ibev_mr_create");
  ibev_cq *cq = ibev_cq_create(device, NULL, on_completions, NULL, &p);
  if (cq == NULL) die_ibev("ibev_cq_create");
  struct ibev_qp_attr qp_attr;
  memset(&qp_attr, 0, sizeof qp_attr);
  qp_attr.send_cq = cq;
  qp_attr.recv_cq = cq;
  qp_attr.cap.max_inline_data = kMessage;
  p.qp = ibev_qp_create(pd, &qp_attr, NULL, NULL);
  if (p.qp == NULL) die_ibev("ibev_qp_create");
  p.worker = ibev_worker_create(NULL, NULL);
  if (p.worker == NULL) die_ibev("ibev_worker_create");
  pthread_mutex_unlock(&p.mutex);

  p.sock = tcp_socket(&p.args, &p.deadline);
  struct ibev_rc_endpoint local;
  if (ibev_qp_endpoint(p.qp, 1, p.args.gid_index, &local) != 0) die_ibev("ibev_qp_endpoint");
  const char *why = NULL;
  const int error = swap_and_connect(&p, &local, connect_first, &p, &why);
  if (error != 0) die("%s: %s", why, ibev_last_error()[0] ? ibev_last_error() : strerror(error));
  printf("connected: QP %06x\n", (unsigned)local.qp_num);
  fflush(stdout);

  int failed;
  if (p.args.server == NULL) {
    failed = play_client(&p);
  } else {
    pthread_mutex_lock(&p.mutex);
    failed = wait_for(&p, &p.done, "waiting for the last message");
    pthread_mutex_unlock(&p.mutex);
  }
  if (!failed) {
    // Neither side goes before both are done: the other's last completion
    // may still need this QP.
    char bye = 0;
    if (write_all(p.sock, &bye, 1) != 0 || read_all(p.sock, &bye, 1, &p.deadline) != 0) {
      die("the last word: %s", strerror(errno));
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double seconds =
        (double)(now.tv_sec - started.tv_sec) + (double)(now.tv_nsec - started.tv_nsec) / 1e9;
    printf("%ld iters in %.2f s, healed %ld times\n", p.args.iters, seconds, p.heals);
  }
  // The end, in an order where nothing uses the health once it is gone:
  // no more completions (the dispatcher stopped), then no reply task still
  // holding it (the worker has run every task posted before a last one).
  ibev_dispatcher_stop(dispatcher);
  ibev_health *health = atomic_exchange(&p.health, NULL);
  pthread_mutex_lock(&p.mutex);
  if (ibev_worker_post(p.worker, drained, &p) == 0) {
    while (!p.drained) pthread_cond_wait(&p.changed, &p.mutex);
  }
  pthread_mutex_unlock(&p.mutex);
  ibev_health_destroy(health);
  ibev_worker_destroy(p.worker);
  ibev_qp_destroy(p.qp);
  ibev_cq_destroy(cq);
  ibev_mr_destroy(p.mr);
  ibev_pd_destroy(pd);
  ibev_device_destroy(device);
  ibev_dispatcher_destroy(dispatcher);
  close(p.sock);
  return failed;
}
