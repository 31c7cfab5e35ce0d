// The C API (<ibev/ibev_c.h>) as C code relies on it, without a device: an
// event reaches a handler with only the element its type names; bad input
// is an errno and a message naming the call, never an exception or a crash;
// a handler that throws (a C++ function passed as a C one) is a failure
// record and dispatch goes on; waits end with their event or their timeout;
// a handler may release its own registration; a worker runs tasks in order
// on its own thread; metrics fill a buffer as snprintf does; a health's
// options are refused before any QP is needed. examples/consumer-c runs the
// same API from C11 on soft-RoCE, and tests/softroce/capi_health_test.cc a
// health through a link flap.
#define BOOST_TEST_MODULE ibev_capi
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ibev/ibev_c.h>

#include "tests/capi/c_caller.h"
#include "tests/capi/c_owned.h"
#include "tests/support/testing.h"

namespace bdata = boost::unit_test::data;

namespace {

using ibev::testing::Freed;

using DispatcherPtr = std::unique_ptr<ibev_dispatcher, Freed<ibev_dispatcher_destroy>>;
using HandlePtr = std::unique_ptr<ibev_handle, Freed<ibev_handle_release>>;
using WaiterPtr = std::unique_ptr<ibev_waiter, Freed<ibev_waiter_destroy>>;

// Every failure the dispatcher reports, copied out of the callback.
struct Failures {
  std::mutex mutex;
  std::vector<std::pair<ibev_failure_kind, std::string>> seen;
  static void sink(const ibev_failure* failure, void* context) {
    auto* self = static_cast<Failures*>(context);
    std::lock_guard<std::mutex> lock(self->mutex);
    self->seen.emplace_back(failure->kind, failure->description);
  }
  std::size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return seen.size();
  }
};

DispatcherPtr make_dispatcher(Failures* failures = nullptr) {
  ibev_dispatcher_attr attr{};
  if (failures != nullptr) {
    attr.on_failure = &Failures::sink;
    attr.failure_context = failures;
  }
  DispatcherPtr dispatcher(ibev_dispatcher_create(&attr));
  BOOST_REQUIRE_MESSAGE(dispatcher, ibev_last_error());
  return dispatcher;
}

// The events one handler heard, copied (an ibev_event lives for the call).
struct Heard {
  std::vector<ibev_event> events;
  static void handler(const ibev_event* event, void* context) {
    static_cast<Heard*>(context)->events.push_back(*event);
  }
};

void run_turns(ibev_dispatcher* dispatcher) {
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_run_once(dispatcher, 1000, nullptr), 0);
}

// Without a device, only the objects' addresses and their device are read.
ibv_context device_stand_in{};
ibv_cq cq_stand_in = [] {
  ibv_cq cq{};
  cq.context = &device_stand_in;
  return cq;
}();
ibv_qp qp_stand_in = [] {
  ibv_qp qp{};
  qp.context = &device_stand_in;
  return qp;
}();
ibv_srq srq_stand_in = [] {
  ibv_srq srq{};
  srq.context = &device_stand_in;
  return srq;
}();
ibv_wq wq_stand_in = [] {
  ibv_wq wq{};
  wq.context = &device_stand_in;
  return wq;
}();

// ------------------------------------------------- what a handler is given

struct Delivered {
  const char* name;
  int code;
  ibv_async_event raw;
  ibev_element_kind kind;
  void* object;  // what it is attached to; null: a device listener hears it
  ibv_cq* cq;
  ibv_qp* qp;
  ibv_srq* srq;
  ibv_wq* wq;
  int port;
};
std::ostream& operator<<(std::ostream& out, const Delivered& d) { return out << d.name; }

ibv_async_event raw_event(int code, ibv_cq* cq, ibv_qp* qp, ibv_srq* srq, ibv_wq* wq, int port) {
  ibv_async_event raw{};
  // A code ibv_event_type has no enumerator for (77) is copied in as bits:
  // converting it to the enum would be undefined (UBSan says so).
  static_assert(sizeof raw.event_type == sizeof code);
  std::memcpy(&raw.event_type, &code, sizeof code);
  if (cq != nullptr) raw.element.cq = cq;
  if (qp != nullptr) raw.element.qp = qp;
  if (srq != nullptr) raw.element.srq = srq;
  if (wq != nullptr) raw.element.wq = wq;
  if (port != 0) raw.element.port_num = port;
  return raw;
}

const Delivered kDelivered[] = {
    {"CQ_ERR", IBV_EVENT_CQ_ERR,
     raw_event(IBV_EVENT_CQ_ERR, &cq_stand_in, nullptr, nullptr, nullptr, 0), IBEV_ELEMENT_CQ,
     &cq_stand_in, &cq_stand_in, nullptr, nullptr, nullptr, 0},
    {"QP_FATAL", IBV_EVENT_QP_FATAL,
     raw_event(IBV_EVENT_QP_FATAL, nullptr, &qp_stand_in, nullptr, nullptr, 0), IBEV_ELEMENT_QP,
     &qp_stand_in, nullptr, &qp_stand_in, nullptr, nullptr, 0},
    {"SRQ_LIMIT_REACHED", IBV_EVENT_SRQ_LIMIT_REACHED,
     raw_event(IBV_EVENT_SRQ_LIMIT_REACHED, nullptr, nullptr, &srq_stand_in, nullptr, 0),
     IBEV_ELEMENT_SRQ, &srq_stand_in, nullptr, nullptr, &srq_stand_in, nullptr, 0},
    {"WQ_FATAL", IBV_EVENT_WQ_FATAL,
     raw_event(IBV_EVENT_WQ_FATAL, nullptr, nullptr, nullptr, &wq_stand_in, 0), IBEV_ELEMENT_WQ,
     &wq_stand_in, nullptr, nullptr, nullptr, &wq_stand_in, 0},
    {"PORT_ERR on port 2", IBV_EVENT_PORT_ERR,
     raw_event(IBV_EVENT_PORT_ERR, nullptr, nullptr, nullptr, nullptr, 2), IBEV_ELEMENT_PORT,
     nullptr, nullptr, nullptr, nullptr, nullptr, 2},
    {"DEVICE_FATAL", IBV_EVENT_DEVICE_FATAL,
     raw_event(IBV_EVENT_DEVICE_FATAL, nullptr, nullptr, nullptr, nullptr, 0), IBEV_ELEMENT_DEVICE,
     nullptr, nullptr, nullptr, nullptr, nullptr, 0},
    {"a code this build does not know (77)", 77,
     raw_event(77, nullptr, nullptr, nullptr, nullptr, 5), IBEV_ELEMENT_DEVICE, nullptr, nullptr,
     nullptr, nullptr, nullptr, 0},
};

}  // namespace

BOOST_DATA_TEST_CASE(a_handler_gets_only_the_element_its_event_names, bdata::make(kDelivered), d) {
  DispatcherPtr dispatcher = make_dispatcher();
  Heard heard;
  HandlePtr handle(
      d.object != nullptr
          ? ibev_attach(dispatcher.get(), d.kind, d.object, nullptr, &Heard::handler, &heard)
          : ibev_listen(dispatcher.get(), &device_stand_in, nullptr, &Heard::handler, &heard));
  BOOST_REQUIRE_MESSAGE(handle, ibev_last_error());
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_inject(dispatcher.get(), &device_stand_in, &d.raw), 0);
  run_turns(dispatcher.get());
  BOOST_REQUIRE_EQUAL(heard.events.size(), 1u);
  const ibev_event& e = heard.events[0];
  BOOST_TEST(e.device == &device_stand_in);
  BOOST_TEST(e.code == d.code);
  BOOST_TEST(e.element_kind == d.kind);
  BOOST_TEST(e.cq == d.cq);
  BOOST_TEST(e.qp == d.qp);
  BOOST_TEST(e.srq == d.srq);
  BOOST_TEST(e.wq == d.wq);
  BOOST_TEST(e.port == d.port);
  BOOST_TEST(e.synthesized == 1);  // injected
  BOOST_TEST(e.loss == IBEV_LOSS_NONE);
  BOOST_TEST(std::string(e.name) == (d.code <= IBV_EVENT_WQ_FATAL
                                         ? ibv_event_type_str(static_cast<ibv_event_type>(d.code))
                                         : "unknown"));
}

BOOST_AUTO_TEST_CASE(filters_take_their_codes_and_port_only) {
  DispatcherPtr dispatcher = make_dispatcher();
  const int codes[] = {IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE};
  const ibev_filter on_port_1{codes, 2, 1};
  Heard heard;
  HandlePtr listener(
      ibev_listen(dispatcher.get(), &device_stand_in, &on_port_1, &Heard::handler, &heard));
  BOOST_REQUIRE(listener);
  for (const auto& [code, port] : {std::pair{IBV_EVENT_PORT_ERR, 1},
                                   {IBV_EVENT_PORT_ERR, 2},
                                   {IBV_EVENT_LID_CHANGE, 1},
                                   {IBV_EVENT_PORT_ACTIVE, 1}}) {
    const ibv_async_event raw = raw_event(code, nullptr, nullptr, nullptr, nullptr, port);
    BOOST_REQUIRE_EQUAL(ibev_dispatcher_inject(dispatcher.get(), &device_stand_in, &raw), 0);
  }
  run_turns(dispatcher.get());
  BOOST_REQUIRE_EQUAL(heard.events.size(), 2u);
  BOOST_TEST(heard.events[0].code == IBV_EVENT_PORT_ERR);
  BOOST_TEST(heard.events[1].code == IBV_EVENT_PORT_ACTIVE);
}

// --------------------------------------------------------------- bad input

namespace {

void ignore(const ibev_event*, void*) {}
void add_nothing(ibev_device*, void*) {}
int made(const void* object) { return object == nullptr ? 0 : -1; }
void ignore_change(const ibev_health_change*, void*) {}
void nothing(void*) {}
ibev_qp* no_qp(const ibev_cm_id*, const ibev_recovery_attempt*, void*) { return nullptr; }
void no_change(uint64_t, const ibev_health_change*, void*) {}
void ignore_cm(const ibev_cm_event*, void*) {}

// A replay's: the recorded "rxe0" is the stand-in, any other name is none.
ibv_context* rxe0_is_the_stand_in(const char* recorded_name, void*) {
  return std::string(recorded_name) == "rxe0" ? &device_stand_in : nullptr;
}
ibev_replay_attr replay_attr(double speed = 0) {
  ibev_replay_attr attr;
  ibev_replay_attr_init(&attr);
  attr.speed = speed;
  attr.device = rxe0_is_the_stand_in;
  return attr;
}
using ReplayPtr = std::unique_ptr<ibev_replay, Freed<ibev_replay_destroy>>;

// A recording as ibev-watch --json writes it, in TEST_TMPDIR; its path.
std::string recording_file(const std::string& name, const std::vector<std::string>& lines) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream out(path, std::ios::trunc);
  out << R"({"recording":"ibev","version":1,"time":"2026-11-21T12:00:00.000000Z"})" << "\n";
  for (const auto& line : lines) out << line << "\n";
  BOOST_REQUIRE(out.flush());
  return path;
}
// One port event of `device` at second `second` past noon.
std::string port_line(const char* device, int code, int second) {
  // Room for any int (GCC's -Wformat-truncation counts it at -O1).
  char time[48];
  std::snprintf(time, sizeof time, "2026-11-21T12:%02d:%02d.000000Z", second / 60, second % 60);
  return std::string(R"({"time":")") + time + R"(","device":")" + device +
         R"(","event":"x","code":)" + std::to_string(code) +
         R"(,"scope":"port","port":1,"severity":"error"})";
}

// A health over no QP with `attr` changed by `edit`: its options are what
// is refused.
int health_with(void (*edit)(ibev_health_attr&)) {
  ibev_health_attr attr;
  ibev_health_attr_init(&attr);
  edit(attr);
  return made(ibev_health_create(nullptr, &attr, ignore_change, nullptr));
}

struct BadCall {
  const char* name;
  const char* api;  // what ibev_last_error() must name
  int error;
  const char* reason;  // and what it must say
  // The call; returns its int result, or for a make: 0 when it returned NULL
  // (and -1 when it made something, which fails the test).
  std::function<int(ibev_dispatcher*)> call;
};
std::ostream& operator<<(std::ostream& out, const BadCall& b) { return out << b.name; }

const BadCall kBadCalls[] = {
    {"starting no dispatcher", "ibev_dispatcher_start", EINVAL, "dispatcher is NULL",
     [](ibev_dispatcher*) { return ibev_dispatcher_start(nullptr); }},
    {"a device monitor that is none of the enum's", "ibev_dispatcher_create", EINVAL,
     "none of its enum's values",
     [](ibev_dispatcher*) {
       ibev_dispatcher_attr attr{};
       attr.device_monitor = static_cast<ibev_device_monitor>(99);
       return made(ibev_dispatcher_create(&attr));
     }},
    {"attaching to a port", "ibev_attach", EINVAL, "a port is not",
     [](ibev_dispatcher* d) {
       return made(ibev_attach(d, IBEV_ELEMENT_PORT, &qp_stand_in, nullptr, ignore, nullptr));
     }},
    {"a kind that is none of the enum's", "ibev_wait_for", EINVAL, "kind 42 is none",
     [](ibev_dispatcher* d) {
       return made(ibev_test_wait_for_kind(d, 42, &qp_stand_in, nullptr, 100));
     }},
    {"attaching to a device", "ibev_attach", EINVAL, "listened to",
     [](ibev_dispatcher* d) {
       return made(ibev_attach(d, IBEV_ELEMENT_DEVICE, &device_stand_in, nullptr, ignore, nullptr));
     }},
    {"a QP handler asking for CQ_ERR", "ibev_attach", EINVAL, "never reaches a qp handler",
     [](ibev_dispatcher* d) {
       const int cq_err = IBV_EVENT_CQ_ERR;
       const ibev_filter filter{&cq_err, 1, 0};
       return made(ibev_attach(d, IBEV_ELEMENT_QP, &qp_stand_in, &filter, ignore, nullptr));
     }},
    {"no handler function", "ibev_attach", EINVAL, "handler is NULL",
     [](ibev_dispatcher* d) {
       return made(ibev_attach(d, IBEV_ELEMENT_QP, &qp_stand_in, nullptr, nullptr, nullptr));
     }},
    {"a filter of two codes at NULL", "ibev_listen", EINVAL, "codes is null",
     [](ibev_dispatcher* d) {
       const ibev_filter filter{nullptr, 2, 0};
       return made(ibev_listen(d, &device_stand_in, &filter, ignore, nullptr));
     }},
    {"a filter of a negative code", "ibev_listen", EINVAL, "event code -1 is negative",
     [](ibev_dispatcher* d) {
       const int codes[] = {IBV_EVENT_PORT_ERR, -1};
       const ibev_filter filter{codes, 2, 0};
       return made(ibev_listen(d, &device_stand_in, &filter, ignore, nullptr));
     }},
    {"a wait for a negative code", "ibev_wait_for", EINVAL, "event code -5 is negative",
     [](ibev_dispatcher* d) {
       const int code = -5;
       const ibev_filter filter{&code, 1, 0};
       return made(ibev_wait_for(d, IBEV_ELEMENT_QP, &qp_stand_in, &filter, 100));
     }},
    {"a filter on port -1", "ibev_listen", EINVAL, "port numbers start at 1",
     [](ibev_dispatcher* d) {
       const ibev_filter filter{nullptr, 0, -1};
       return made(ibev_listen(d, &device_stand_in, &filter, ignore, nullptr));
     }},
    {"injecting a port event on port 0", "ibev_dispatcher_inject", EINVAL,
     "port numbers start at 1",
     [](ibev_dispatcher* d) {
       const ibv_async_event raw =
           raw_event(IBV_EVENT_PORT_ERR, nullptr, nullptr, nullptr, nullptr, 0);
       return ibev_dispatcher_inject(d, &device_stand_in, &raw);
     }},
    {"injecting on no device", "ibev_dispatcher_inject", EINVAL, "device is NULL",
     [](ibev_dispatcher* d) {
       const ibv_async_event raw =
           raw_event(IBV_EVENT_DEVICE_FATAL, nullptr, nullptr, nullptr, nullptr, 0);
       return ibev_dispatcher_inject(d, nullptr, &raw);
     }},
    {"a wait with no timeout", "ibev_wait_for", EINVAL, "above zero",
     [](ibev_dispatcher* d) {
       return made(ibev_wait_for(d, IBEV_ELEMENT_QP, &qp_stand_in, nullptr, 0));
     }},
    {"waiting on no waiter", "ibev_waiter_wait", EINVAL, "waiter is NULL",
     [](ibev_dispatcher*) { return ibev_waiter_wait(nullptr, nullptr, nullptr); }},
    {"a CQ on no device", "ibev_cq_create", EINVAL, "device is NULL",
     [](ibev_dispatcher*) {
       return made(ibev_cq_create(nullptr, nullptr, nullptr, nullptr, nullptr));
     }},
    {"a QP with no attributes", "ibev_qp_create", EINVAL, "attr is NULL",
     [](ibev_dispatcher*) { return made(ibev_qp_create(nullptr, nullptr, nullptr, nullptr)); }},
    // Told before the QP is looked at: a negative time is wrong whatever
    // the QP (once, it went to C++ and came back as a call_after's error).
    {"a drain of a negative timeout", "ibev_qp_drain", EINVAL, "timeout_ms is -1",
     [](ibev_dispatcher*) {
       ibev_drain_report report{};
       return ibev_qp_drain(nullptr, -1, &report);
     }},
    {"a PD on no device", "ibev_pd_create", EINVAL, "device is NULL",
     [](ibev_dispatcher*) { return made(ibev_pd_create(nullptr)); }},
    {"device clients when devices are not watched", "ibev_clients_create", EINVAL,
     "device_monitor is kOff",
     [](ibev_dispatcher*) {
       ibev_dispatcher_attr attr{};
       attr.device_monitor = IBEV_DEVICE_MONITOR_OFF;
       DispatcherPtr unwatched(ibev_dispatcher_create(&attr));
       return made(ibev_clients_create(unwatched.get()));
     }},
    {"a client with no remove", "ibev_clients_register", EINVAL, "add and remove are required",
     [](ibev_dispatcher* d) {
       std::unique_ptr<ibev_clients, Freed<ibev_clients_destroy>> clients(ibev_clients_create(d));
       BOOST_REQUIRE_MESSAGE(clients, ibev_last_error());
       const ibev_client client{"half", add_nothing, nullptr, nullptr};
       return made(ibev_clients_register(clients.get(), &client));
     }},
    {"an endpoint that is not one", "ibev_rc_endpoint_from_wire", EINVAL, "not 51",
     [](ibev_dispatcher*) {
       ibev_rc_endpoint endpoint{};
       return ibev_rc_endpoint_from_wire("0000:zz", 7, &endpoint);
     }},
    {"a PSN wider than 24 bits", "ibev_rc_endpoint_to_wire", EINVAL, "24 bits",
     [](ibev_dispatcher*) {
       const ibev_rc_endpoint endpoint{1, {}, 0x1000000, 0};
       char wire[IBEV_RC_ENDPOINT_WIRE_SIZE];
       return ibev_rc_endpoint_to_wire(&endpoint, wire);
     }},
    {"a health over no QP", "ibev_health_create", EINVAL, "qp is NULL",
     [](ibev_dispatcher*) {
       return made(ibev_health_create(nullptr, nullptr, ignore_change, nullptr));
     }},
    {"a health with no handler", "ibev_health_create", EINVAL, "on_change is NULL",
     [](ibev_dispatcher*) { return made(ibev_health_create(nullptr, nullptr, nullptr, nullptr)); }},
    {"a keepalive every -5 ms", "ibev_health_create", EINVAL, "a keepalive needs an interval",
     [](ibev_dispatcher*) {
       return health_with([](ibev_health_attr& a) { a.keepalive_interval_ms = -5; });
     }},
    {"a keepalive of no misses", "ibev_health_create", EINVAL, "at least one miss",
     [](ibev_dispatcher*) {
       return health_with([](ibev_health_attr& a) {
         a.keepalive_interval_ms = 100;
         a.keepalive_misses = 0;
       });
     }},
    {"a deadline of -1 ms", "ibev_health_create", EINVAL, "a deadline of 0 (none) or more",
     [](ibev_dispatcher*) {
       return health_with([](ibev_health_attr& a) { a.deadline_ms = -1; });
     }},
    {"a jitter of 2", "ibev_health_create", EINVAL, "jitter is outside [0, 1]",
     [](ibev_dispatcher*) {
       return health_with([](ibev_health_attr& a) { a.policy.jitter = 2; });
     }},
    {"a zeroed policy", "ibev_health_create", EINVAL, "first_delay is not above 0",
     [](ibev_dispatcher*) {
       return health_with([](ibev_health_attr& a) { a.policy = ibev_recovery_policy{}; });
     }},
    {"a recovery mode that is none of the enum's", "ibev_health_create", EINVAL,
     "attr->mode 7 is none",
     [](ibev_dispatcher*) {
       return health_with([](ibev_health_attr& a) {
         const int bits = 7;
         std::memcpy(&a.mode, &bits, sizeof a.mode);
       });
     }},
    {"the causes of no health", "ibev_health_causes", EINVAL, "health is NULL",
     [](ibev_dispatcher*) {
       size_t count = 0;
       return ibev_health_causes(nullptr, nullptr, 0, &count);
     }},
    {"a cause told to no health", "ibev_health_add_cause", EINVAL, "health is NULL",
     [](ibev_dispatcher*) {
       const ibev_health_cause cause{IBEV_HEALTH_APPLICATION, 0, 0, "mine"};
       return ibev_health_add_cause(nullptr, &cause);
     }},
    {"retrying no health", "ibev_health_retry_now", EINVAL, "health is NULL",
     [](ibev_dispatcher*) { return ibev_health_retry_now(nullptr); }},
    {"connecting no attempt", "ibev_recovery_attempt_connect", EINVAL, "attempt is NULL",
     [](ibev_dispatcher*) {
       const ibev_rc_endpoint remote{1, {}, 1, 0};
       return ibev_recovery_attempt_connect(nullptr, &remote);
     }},
    {"failing no attempt", "ibev_recovery_attempt_fail", EINVAL, "attempt is NULL",
     [](ibev_dispatcher*) { return ibev_recovery_attempt_fail(nullptr, "why"); }},
    {"resetting no QP", "ibev_qp_reset", EINVAL, "qp is NULL",
     [](ibev_dispatcher*) { return ibev_qp_reset(nullptr); }},
    {"no QP to INIT", "ibev_qp_to_init", EINVAL, "qp is NULL",
     [](ibev_dispatcher*) { return ibev_qp_to_init(nullptr, nullptr); }},
    {"posting no task", "ibev_worker_post", EINVAL, "task is NULL",
     [](ibev_dispatcher*) {
       std::unique_ptr<ibev_worker, Freed<ibev_worker_destroy>> worker(
           ibev_worker_create(nullptr, nullptr));
       BOOST_REQUIRE_MESSAGE(worker, ibev_last_error());
       return ibev_worker_post(worker.get(), nullptr, nullptr);
     }},
    {"posting to no worker", "ibev_worker_post", EINVAL, "worker is NULL",
     [](ibev_dispatcher*) { return ibev_worker_post(nullptr, nothing, nullptr); }},
    {"a CM channel on no dispatcher", "ibev_cm_channel_create", EINVAL, "dispatcher is NULL",
     [](ibev_dispatcher*) { return made(ibev_cm_channel_create(nullptr)); }},
    {"a session with no attributes", "ibev_cm_session_connect", EINVAL, "attr is NULL",
     [](ibev_dispatcher*) {
       return made(ibev_cm_session_connect(nullptr, "::1", 1, nullptr, ignore_change, nullptr));
     }},
    {"a session with no make_qp", "ibev_cm_session_connect", EINVAL, "attr->make_qp is NULL",
     [](ibev_dispatcher*) {
       ibev_cm_session_attr attr;
       ibev_cm_session_attr_init(&attr);
       return made(ibev_cm_session_connect(nullptr, "::1", 1, &attr, ignore_change, nullptr));
     }},
    {"a session whose health refuses its options", "ibev_cm_session_connect", EINVAL,
     "jitter is outside [0, 1]",
     [](ibev_dispatcher*) {
       ibev_cm_session_attr attr;
       ibev_cm_session_attr_init(&attr);
       attr.make_qp = no_qp;
       attr.health.policy.jitter = -1;
       return made(ibev_cm_session_connect(nullptr, "::1", 1, &attr, ignore_change, nullptr));
     }},
    {"private data at NULL", "ibev_cm_session_connect", EINVAL, "attr->private_data is NULL",
     [](ibev_dispatcher*) {
       ibev_cm_session_attr attr;
       ibev_cm_session_attr_init(&attr);
       attr.make_qp = no_qp;
       attr.private_data_length = 8;
       return made(ibev_cm_session_connect(nullptr, "::1", 1, &attr, ignore_change, nullptr));
     }},
    {"a session on no channel", "ibev_cm_session_connect", EINVAL, "channel is NULL",
     [](ibev_dispatcher*) {
       ibev_cm_session_attr attr;
       ibev_cm_session_attr_init(&attr);
       attr.make_qp = no_qp;
       attr.id = 7;
       return made(ibev_cm_session_connect(nullptr, "::1", 1, &attr, ignore_change, nullptr));
     }},
    {"an acceptor with no on_session", "ibev_cm_acceptor_listen", EINVAL, "on_session is NULL",
     [](ibev_dispatcher*) {
       ibev_cm_acceptor_attr attr;
       ibev_cm_acceptor_attr_init(&attr);
       attr.make_qp = no_qp;
       return made(ibev_cm_acceptor_listen(nullptr, "::1", 0, &attr, nullptr, no_change, nullptr));
     }},
    {"initializing a QP for no id", "ibev_cm_id_init_qp", EINVAL, "id is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_init_qp(nullptr, nullptr); }},
    {"a CM id with no handler", "ibev_cm_id_create", EINVAL, "on_event is NULL",
     [](ibev_dispatcher*) { return made(ibev_cm_id_create(nullptr, nullptr, nullptr)); }},
    {"a CM id on no channel", "ibev_cm_id_create", EINVAL, "channel is NULL",
     [](ibev_dispatcher*) { return made(ibev_cm_id_create(nullptr, ignore_cm, nullptr)); }},
    {"resolving no id", "ibev_cm_id_resolve_addr", EINVAL, "id is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_resolve_addr(nullptr, nullptr, "::1", 1, 100); }},
    {"resolving to no host", "ibev_cm_id_resolve_addr", EINVAL, "host is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_resolve_addr(nullptr, nullptr, nullptr, 1, 100); }},
    {"resolving a name, not an address", "ibev_cm_id_resolve_addr", EINVAL, "'localhost'",
     [](ibev_dispatcher*) {
       return ibev_cm_id_resolve_addr(nullptr, nullptr, "localhost", 1, 100);
     }},
    {"resolving from a bad source", "ibev_cm_id_resolve_addr", EINVAL, "'10.0.0'",
     [](ibev_dispatcher*) { return ibev_cm_id_resolve_addr(nullptr, "10.0.0", "::1", 1, 100); }},
    {"resolving no id's route", "ibev_cm_id_resolve_route", EINVAL, "id is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_resolve_route(nullptr, 100); }},
    {"listening on a bad address", "ibev_cm_id_listen", EINVAL, "'::g'",
     [](ibev_dispatcher*) { return ibev_cm_id_listen(nullptr, "::g", 0, 8); }},
    {"listening with no id", "ibev_cm_id_listen", EINVAL, "id is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_listen(nullptr, "::", 0, 8); }},
    {"connecting no id", "ibev_cm_id_connect", EINVAL, "id is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_connect(nullptr, nullptr, nullptr); }},
    {"a depth past a byte", "ibev_cm_id_connect", EINVAL, "attr->initiator_depth 256",
     [](ibev_dispatcher*) {
       ibev_cm_connect_attr attr;
       ibev_cm_connect_attr_init(&attr);
       attr.initiator_depth = 256;
       return ibev_cm_id_connect(nullptr, nullptr, &attr);
     }},
    {"accepting with private data at NULL", "ibev_cm_id_accept", EINVAL,
     "attr->private_data is NULL",
     [](ibev_dispatcher*) {
       ibev_cm_connect_attr attr;
       ibev_cm_connect_attr_init(&attr);
       attr.private_data_length = 4;
       return ibev_cm_id_accept(nullptr, nullptr, &attr);
     }},
    {"a responder depth below -1", "ibev_cm_id_accept", EINVAL, "attr->responder_resources -2",
     [](ibev_dispatcher*) {
       ibev_cm_connect_attr attr;
       ibev_cm_connect_attr_init(&attr);
       attr.responder_resources = -2;
       return ibev_cm_id_accept(nullptr, nullptr, &attr);
     }},
    {"rejecting with data at NULL", "ibev_cm_id_reject", EINVAL, "data is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_reject(nullptr, nullptr, 3); }},
    {"rejecting no id", "ibev_cm_id_reject", EINVAL, "id is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_reject(nullptr, nullptr, 0); }},
    {"disconnecting no id", "ibev_cm_id_disconnect", EINVAL, "id is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_disconnect(nullptr); }},
    {"the port of no id", "ibev_cm_id_port_num", EINVAL, "id is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_port_num(nullptr); }},
    {"the address of no id", "ibev_cm_id_local_address", EINVAL, "id is NULL",
     [](ibev_dispatcher*) {
       char text[64];
       return ibev_cm_id_local_address(nullptr, text, sizeof text, nullptr);
     }},
    {"the peer of no id", "ibev_cm_id_peer_address", EINVAL, "id is NULL",
     [](ibev_dispatcher*) { return ibev_cm_id_peer_address(nullptr, nullptr, 0, nullptr); }},
    {"metrics of no dispatcher", "ibev_write_metrics", EINVAL, "dispatcher is NULL",
     [](ibev_dispatcher*) {
       char text[16];
       return ibev_write_metrics(nullptr, nullptr, 0, text, sizeof text, nullptr);
     }},
    {"metrics into no buffer of 16 bytes", "ibev_write_metrics", EINVAL, "buffer is NULL",
     [](ibev_dispatcher* d) { return ibev_write_metrics(d, nullptr, 0, nullptr, 16, nullptr); }},
    {"metrics of a NULL device", "ibev_write_metrics", EINVAL, "devices[0] is NULL",
     [](ibev_dispatcher* d) {
       ibev_device* const devices[] = {nullptr};
       return ibev_write_metrics(d, devices, 1, nullptr, 0, nullptr);
     }},
    {"a replay into no dispatcher", "ibev_replay_create", EINVAL, "dispatcher is NULL",
     [](ibev_dispatcher*) {
       const ibev_replay_attr attr = replay_attr();
       return made(ibev_replay_create(nullptr, &attr));
     }},
    {"a replay with no attributes", "ibev_replay_create", EINVAL, "attr is NULL",
     [](ibev_dispatcher* d) { return made(ibev_replay_create(d, nullptr)); }},
    {"a replay with no device function", "ibev_replay_create", EINVAL, "attr->device is NULL",
     [](ibev_dispatcher* d) {
       ibev_replay_attr attr;
       ibev_replay_attr_init(&attr);
       return made(ibev_replay_create(d, &attr));
     }},
    {"a replay at a speed of 1e7", "ibev_replay_create", EINVAL, "replay speed",
     [](ibev_dispatcher* d) {
       const ibev_replay_attr attr = replay_attr(1e7);
       return made(ibev_replay_create(d, &attr));
     }},
    {"a replay at a negative speed", "ibev_replay_create", EINVAL, "replay speed",
     [](ibev_dispatcher* d) {
       const ibev_replay_attr attr = replay_attr(-1);
       return made(ibev_replay_create(d, &attr));
     }},
    {"playing no replay", "ibev_replay_play_file", EINVAL, "replay is NULL",
     [](ibev_dispatcher*) { return ibev_replay_play_file(nullptr, "x.jsonl", nullptr); }},
    {"playing no path", "ibev_replay_play_file", EINVAL, "path is NULL",
     [](ibev_dispatcher* d) {
       const ibev_replay_attr attr = replay_attr();
       ReplayPtr replay(ibev_replay_create(d, &attr));
       return ibev_replay_play_file(replay.get(), nullptr, nullptr);
     }},
    {"playing a file that is not there", "ibev_replay_play_file", ENOENT,
     "open /nonexistent/flap.jsonl: No such file",
     [](ibev_dispatcher* d) {
       const ibev_replay_attr attr = replay_attr();
       ReplayPtr replay(ibev_replay_create(d, &attr));
       return ibev_replay_play_file(replay.get(), "/nonexistent/flap.jsonl", nullptr);
     }},
    {"playing a malformed recording", "ibev_replay_play_file", EINVAL,
     "malformed.jsonl:3: ",
     [](ibev_dispatcher* d) {
       const std::string path = recording_file(
           "malformed.jsonl", {port_line("rxe0", IBV_EVENT_PORT_ERR, 0), "{\"time\":"});
       const ibev_replay_attr attr = replay_attr();
       ReplayPtr replay(ibev_replay_create(d, &attr));
       ibev_replay_stats stats{};
       const int result = ibev_replay_play_file(replay.get(), path.c_str(), &stats);
       BOOST_TEST(stats.injected == 0u);  // read whole before anything is played
       return result;
     }},
};

}  // namespace

BOOST_DATA_TEST_CASE(bad_input_is_an_errno_naming_the_call, bdata::make(kBadCalls), bad) {
  DispatcherPtr dispatcher = make_dispatcher();
  errno = 0;
  const int result = bad.call(dispatcher.get());
  const int error = errno;
  if (result == 0) {  // a make that returned NULL: the errno says why
    BOOST_TEST(error == bad.error, "errno " << error << ", wanted " << bad.error);
  } else {
    BOOST_TEST(result == bad.error, "returned " << result << ", wanted " << bad.error);
  }
  const std::string said = ibev_last_error();
  BOOST_TEST(said.rfind(std::string(bad.api) + ": ", 0) == 0, "'" << said << "'");
  BOOST_TEST(said.find(bad.reason) != std::string::npos, "'" << said << "'");
  BOOST_TEST_MESSAGE(bad.name << ": " << said);
}

BOOST_AUTO_TEST_CASE(the_last_error_is_the_calling_thread_s) {
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_start(nullptr), EINVAL);
  std::string elsewhere = "unset";
  std::thread([&] { elsewhere = ibev_last_error(); }).join();
  BOOST_TEST(elsewhere.empty());
  BOOST_TEST(std::string(ibev_last_error()).find("dispatcher is NULL") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(controlling_calls_out_of_turn_are_einval_not_exceptions) {
  DispatcherPtr dispatcher = make_dispatcher();
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_start(dispatcher.get()), 0);
  BOOST_TEST(ibev_dispatcher_start(dispatcher.get()) == EINVAL);
  BOOST_TEST(ibev_dispatcher_run_once(dispatcher.get(), 0, nullptr) == EINVAL);
  BOOST_TEST(std::string(ibev_last_error()).rfind("ibev_dispatcher_run_once: ", 0) == 0);
  BOOST_TEST(ibev_dispatcher_stop(dispatcher.get()) == 0);
  BOOST_TEST(ibev_dispatcher_fd(dispatcher.get()) >= 0);
  BOOST_TEST(ibev_dispatcher_fd(nullptr) == -1);
}

// ------------------------------------------------ handlers that misbehave

namespace {

// A C++ function passed where C expects a C one: what it throws must not
// cross the C API (nor reach the C caller's frames).
void throwing_handler(const ibev_event*, void* context) {
  ++*static_cast<int*>(context);
  throw std::runtime_error("thrown inside a C callback");
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_handler_that_throws_is_a_failure_record_and_dispatch_goes_on) {
  Failures failures;
  DispatcherPtr dispatcher = make_dispatcher(&failures);
  int calls = 0;
  HandlePtr handle(ibev_attach(dispatcher.get(), IBEV_ELEMENT_QP, &qp_stand_in, nullptr,
                               throwing_handler, &calls));
  BOOST_REQUIRE(handle);
  const ibv_async_event raw =
      raw_event(IBV_EVENT_COMM_EST, nullptr, &qp_stand_in, nullptr, nullptr, 0);
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_inject(dispatcher.get(), &device_stand_in, &raw), 0);
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_inject(dispatcher.get(), &device_stand_in, &raw), 0);
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_start(dispatcher.get()), 0);
  BOOST_TEST(ibev::testing::eventually([&] { return failures.count() == 2; }));
  BOOST_TEST(calls == 2);  // the second event was delivered after the first threw
  std::lock_guard<std::mutex> lock(failures.mutex);
  for (const auto& [kind, description] : failures.seen) {
    BOOST_TEST(kind == IBEV_FAILURE_HANDLER_THREW);
    BOOST_TEST(description.find("thrown inside a C callback") != std::string::npos, description);
  }
}

namespace {

struct SelfRelease {
  ibev_handle* handle = nullptr;
  int calls = 0;
  static void handler(const ibev_event*, void* context) {
    auto* self = static_cast<SelfRelease*>(context);
    ++self->calls;
    ibev_handle_release(std::exchange(self->handle, nullptr));  // returns at once
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_handler_may_release_its_own_registration) {
  DispatcherPtr dispatcher = make_dispatcher();
  SelfRelease self;
  self.handle = ibev_attach(dispatcher.get(), IBEV_ELEMENT_QP, &qp_stand_in, nullptr,
                            &SelfRelease::handler, &self);
  BOOST_REQUIRE(self.handle != nullptr);
  const ibv_async_event raw =
      raw_event(IBV_EVENT_COMM_EST, nullptr, &qp_stand_in, nullptr, nullptr, 0);
  for (int i = 0; i < 3; ++i) {
    BOOST_REQUIRE_EQUAL(ibev_dispatcher_inject(dispatcher.get(), &device_stand_in, &raw), 0);
  }
  run_turns(dispatcher.get());
  BOOST_TEST(self.calls == 1);
  BOOST_TEST(self.handle == nullptr);
}

namespace {

// A handler held inside its call until the test lets it go (20 s at most,
// so that a test that never does fails instead of hanging).
struct Held {
  std::atomic<bool> entered{false};
  std::atomic<bool> go{false};
  std::atomic<bool> returned{false};
  static void handler(const ibev_event*, void* context) {
    auto* self = static_cast<Held*>(context);
    self->entered = true;
    static_cast<void>(ibev::testing::eventually([self] { return self->go.load(); },
                                                std::chrono::seconds(20),
                                                std::chrono::milliseconds(1)));
    self->returned = true;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_release_on_another_thread_returns_after_the_running_handler) {
  DispatcherPtr dispatcher = make_dispatcher();
  Held held;
  ibev_handle* handle =
      ibev_attach(dispatcher.get(), IBEV_ELEMENT_QP, &qp_stand_in, nullptr, &Held::handler, &held);
  BOOST_REQUIRE(handle != nullptr);
  const ibv_async_event raw =
      raw_event(IBV_EVENT_COMM_EST, nullptr, &qp_stand_in, nullptr, nullptr, 0);
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_inject(dispatcher.get(), &device_stand_in, &raw), 0);
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_start(dispatcher.get()), 0);
  BOOST_REQUIRE(ibev::testing::eventually([&] { return held.entered.load(); }));
  std::atomic<bool> released{false};
  bool handler_done_at_release = false;
  std::thread releasing([&] {
    ibev_handle_release(handle);
    handler_done_at_release = held.returned;  // the context may be freed now
    released = true;
  });
  // The release waits while the handler runs; the handler is not let go
  // before the release had time to return wrongly.
  BOOST_TEST(ibev::testing::stays_false_for(
      [&] { return released.load(); }, std::chrono::milliseconds(100),
      "a release that did not wait for the running handler returns within microseconds"));
  held.go = true;
  releasing.join();
  BOOST_TEST(handler_done_at_release);
}

// ----------------------------------------------------------------- waiting

BOOST_AUTO_TEST_CASE(a_waiter_ends_with_its_event_or_its_timeout) {
  DispatcherPtr dispatcher = make_dispatcher();
  const int sq_drained = IBV_EVENT_SQ_DRAINED;
  const ibev_filter only_sq_drained{&sq_drained, 1, 0};
  WaiterPtr drained(
      ibev_wait_for(dispatcher.get(), IBEV_ELEMENT_QP, &qp_stand_in, &only_sq_drained, 10000));
  WaiterPtr never(
      ibev_wait_for(dispatcher.get(), IBEV_ELEMENT_QP, &qp_stand_in, &only_sq_drained, 50));
  BOOST_REQUIRE(drained && never);
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_start(dispatcher.get()), 0);
  ibev_wait_outcome outcome = IBEV_WAIT_EVENT;
  BOOST_TEST(ibev_waiter_wait(never.get(), &outcome, nullptr) == 0);
  BOOST_TEST(outcome == IBEV_WAIT_TIMED_OUT);

  const ibv_async_event raw =
      raw_event(IBV_EVENT_SQ_DRAINED, nullptr, &qp_stand_in, nullptr, nullptr, 0);
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_inject(dispatcher.get(), &device_stand_in, &raw), 0);
  ibev_event event{};
  BOOST_TEST(ibev_waiter_wait(drained.get(), &outcome, &event) == 0);
  BOOST_TEST(outcome == IBEV_WAIT_EVENT);
  BOOST_TEST(event.qp == &qp_stand_in);
  BOOST_TEST(event.code == IBV_EVENT_SQ_DRAINED);
}

namespace {

struct WaitInHandler {
  ibev_waiter* waiter = nullptr;
  std::atomic<int> result{-1};
  static void handler(const ibev_event*, void* context) {
    auto* self = static_cast<WaitInHandler*>(context);
    self->result = ibev_waiter_wait(self->waiter, nullptr, nullptr);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(waiting_on_the_dispatching_thread_is_einval_not_a_hang) {
  DispatcherPtr dispatcher = make_dispatcher();
  WaitInHandler in_handler;
  WaiterPtr waiter(ibev_wait_for(dispatcher.get(), IBEV_ELEMENT_CQ, &cq_stand_in, nullptr, 10000));
  in_handler.waiter = waiter.get();
  HandlePtr handle(ibev_attach(dispatcher.get(), IBEV_ELEMENT_QP, &qp_stand_in, nullptr,
                               &WaitInHandler::handler, &in_handler));
  BOOST_REQUIRE(waiter && handle);
  const ibv_async_event raw =
      raw_event(IBV_EVENT_COMM_EST, nullptr, &qp_stand_in, nullptr, nullptr, 0);
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_inject(dispatcher.get(), &device_stand_in, &raw), 0);
  run_turns(dispatcher.get());
  BOOST_TEST(in_handler.result.load() == EINVAL);
}

BOOST_AUTO_TEST_CASE(connect_attr_init_gives_ibv_rc_pingpong_s_attributes) {
  ibev_connect_attr attr;
  std::memset(&attr, 0xff, sizeof attr);
  ibev_connect_attr_init(&attr);
  BOOST_TEST(attr.port == 1);
  BOOST_TEST(attr.gid_index == 0);
  BOOST_TEST(attr.path_mtu == 0);  // the port's active MTU
  BOOST_TEST(attr.timeout == 14);
  BOOST_TEST(attr.retry_cnt == 7);
  BOOST_TEST(attr.rnr_retry == 7);
  BOOST_TEST(attr.min_rnr_timer == 12);
  BOOST_TEST(attr.max_rd_atomic == 1);
  BOOST_TEST(attr.access_flags ==
             (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
}

BOOST_AUTO_TEST_CASE(health_attr_init_gives_connection_health_s_defaults) {
  ibev_health_attr attr;
  std::memset(&attr, 0xff, sizeof attr);
  ibev_health_attr_init(&attr);
  BOOST_TEST(attr.port == 0);  // the QP's own
  BOOST_TEST(attr.initial_down == 0);
  BOOST_TEST(attr.executor == nullptr);
  BOOST_TEST(attr.keepalive_interval_ms == 0);
  BOOST_TEST(attr.keepalive_misses == 3u);
  BOOST_TEST(attr.deadline_ms == 0);
  BOOST_TEST(attr.mode == IBEV_RECOVERY_RESET_IN_PLACE);
  BOOST_TEST(attr.policy.first_delay_ms == 100);
  BOOST_TEST(attr.policy.max_delay_ms == 5000);
  BOOST_TEST(attr.policy.jitter == 0.5);
  BOOST_TEST(attr.policy.max_recoveries == 3u);
  BOOST_TEST(attr.policy.window_ms == 3000);
  BOOST_TEST(attr.policy.give_up_after_ms == 60000);
  BOOST_TEST(attr.connect.port == 1);
  BOOST_TEST(attr.connect.retry_cnt == 7);
  BOOST_TEST(attr.reconnect == nullptr);
  BOOST_TEST(attr.reconnect_context == nullptr);
}

BOOST_AUTO_TEST_CASE(cm_attr_inits_give_the_sessions_defaults) {
  ibev_cm_session_attr session;
  std::memset(&session, 0xff, sizeof session);
  ibev_cm_session_attr_init(&session);
  BOOST_TEST(session.id == 0u);
  BOOST_TEST(session.make_qp == nullptr);
  BOOST_TEST(session.private_data_length == 0u);
  BOOST_TEST(session.resolve_timeout_ms == 2000);
  BOOST_TEST(session.connect_timeout_ms == 5000);
  BOOST_TEST(session.health.policy.first_delay_ms == 100);
  ibev_cm_acceptor_attr acceptor;
  std::memset(&acceptor, 0xff, sizeof acceptor);
  ibev_cm_acceptor_attr_init(&acceptor);
  BOOST_TEST(acceptor.backlog == 64);
  BOOST_TEST(acceptor.connect_timeout_ms == 5000);
  BOOST_TEST(acceptor.make_qp == nullptr);
  BOOST_TEST(acceptor.health.keepalive_misses == 3u);
  BOOST_TEST(ibev_cm_session_id(nullptr) == 0u);
  BOOST_TEST(ibev_cm_session_health(nullptr) == nullptr);
  BOOST_TEST(ibev_cm_acceptor_port(nullptr) == 0u);
  BOOST_TEST(ibev_cm_acceptor_sessions(nullptr) == 0u);
  BOOST_TEST(ibev_cm_id_device_name(nullptr) == nullptr);
  ibev_cm_id_destroy(nullptr);
  ibev_cm_session_destroy(nullptr);
  ibev_cm_acceptor_destroy(nullptr);
  ibev_cm_channel_destroy(nullptr);
}

BOOST_AUTO_TEST_CASE(cm_connect_attr_init_gives_cm_connect_options_defaults) {
  ibev_cm_connect_attr attr;
  std::memset(&attr, 0xff, sizeof attr);
  ibev_cm_connect_attr_init(&attr);
  BOOST_TEST(attr.private_data == nullptr);
  BOOST_TEST(attr.private_data_length == 0u);
  BOOST_TEST(attr.responder_resources == -1);
  BOOST_TEST(attr.initiator_depth == -1);
  BOOST_TEST(attr.retry_count == 7);
  BOOST_TEST(attr.rnr_retry_count == 7);
}

BOOST_AUTO_TEST_CASE(a_health_s_state_of_null_is_failed_and_einval) {
  errno = 0;
  BOOST_TEST(ibev_health_state(nullptr) == IBEV_CONNECTION_FAILED);
  BOOST_TEST(errno == EINVAL);
  BOOST_TEST(std::string(ibev_last_error()) == "ibev_health_state: health is NULL");
  BOOST_TEST(ibev_health_qp(nullptr) == nullptr);
  BOOST_TEST(ibev_recovery_attempt_number(nullptr) == 0u);
  BOOST_TEST(ibev_recovery_attempt_qp(nullptr) == nullptr);
  ibev_health_destroy(nullptr);
  ibev_recovery_attempt_destroy(nullptr);
}

// ---------------------------------------------------------------- executors

namespace {

// What the worker's tasks saw: their order and whether they ran there.
struct Tasks {
  ibev_worker* worker = nullptr;
  std::mutex mutex;
  std::vector<int> order;
  bool all_on_worker = true;
  struct One {
    Tasks* tasks;
    int number;
  };
  static void run(void* context) {
    auto* one = static_cast<One*>(context);
    std::lock_guard<std::mutex> lock(one->tasks->mutex);
    one->tasks->order.push_back(one->number);
    one->tasks->all_on_worker =
        one->tasks->all_on_worker && ibev_worker_is_current(one->tasks->worker) == 1;
  }
};

void throwing_task(void*) { throw std::runtime_error("thrown inside a C task"); }

}  // namespace

BOOST_AUTO_TEST_CASE(a_worker_runs_its_tasks_in_order_on_its_own_thread) {
  Failures failures;
  Tasks tasks;
  std::vector<Tasks::One> ones;
  for (int i = 0; i < 50; ++i) ones.push_back({&tasks, i});
  {
    std::unique_ptr<ibev_worker, Freed<ibev_worker_destroy>> worker(
        ibev_worker_create(&Failures::sink, &failures));
    BOOST_REQUIRE_MESSAGE(worker, ibev_last_error());
    tasks.worker = worker.get();
    BOOST_TEST(ibev_worker_is_current(worker.get()) == 0);
    BOOST_REQUIRE_EQUAL(ibev_worker_post(worker.get(), throwing_task, nullptr), 0);
    for (Tasks::One& one : ones) {
      BOOST_REQUIRE_EQUAL(ibev_worker_post(worker.get(), &Tasks::run, &one), 0);
    }
  }  // destroying it runs what was posted, then joins
  std::vector<int> expected(50);
  for (int i = 0; i < 50; ++i) expected[i] = i;
  BOOST_TEST(tasks.order == expected, boost::test_tools::per_element());
  BOOST_TEST(tasks.all_on_worker);
  BOOST_REQUIRE_EQUAL(failures.count(), 1u);  // the throw, and the tasks after it ran
  BOOST_TEST(failures.seen[0].second.find("thrown inside a C task") != std::string::npos,
             failures.seen[0].second);
  BOOST_TEST(ibev_worker_is_current(nullptr) == 0);
}

// ------------------------------------------------------------------ metrics

BOOST_AUTO_TEST_CASE(metrics_fill_a_buffer_as_snprintf_does) {
  DispatcherPtr dispatcher = make_dispatcher();
  size_t length = 0;
  BOOST_REQUIRE_EQUAL(ibev_write_metrics(dispatcher.get(), nullptr, 0, nullptr, 0, &length), 0);
  BOOST_REQUIRE(length > 0u);
  std::vector<char> whole(length + 1, 'x');
  size_t again = 0;
  BOOST_REQUIRE_EQUAL(
      ibev_write_metrics(dispatcher.get(), nullptr, 0, whole.data(), whole.size(), &again), 0);
  BOOST_TEST(again == length);
  const std::string text(whole.data());
  BOOST_TEST(text.size() == length);
  BOOST_TEST(text.find("# TYPE ibev_dispatcher_") != std::string::npos, text);
  // Too small: cut, NUL-terminated, and the length still the whole text's.
  char cut[11];
  std::memset(cut, 'x', sizeof cut);
  BOOST_REQUIRE_EQUAL(
      ibev_write_metrics(dispatcher.get(), nullptr, 0, cut, sizeof cut, &again), 0);
  BOOST_TEST(again == length);
  BOOST_TEST(std::string(cut) == text.substr(0, 10));
}

// ------------------------------------------------------------------ replay

BOOST_AUTO_TEST_CASE(a_replayed_recording_reaches_c_listeners_and_counts_the_rest) {
  DispatcherPtr dispatcher = make_dispatcher();
  Heard heard;
  HandlePtr listener(
      ibev_listen(dispatcher.get(), &device_stand_in, nullptr, &Heard::handler, &heard));
  BOOST_REQUIRE_MESSAGE(listener, ibev_last_error());
  const std::string path = recording_file(
      "flap.jsonl",
      {port_line("rxe0", IBV_EVENT_PORT_ERR, 0),
       port_line("mlx5_9", IBV_EVENT_PORT_ERR, 1),  // no device here: skipped
       R"({"time":"2026-11-21T12:00:02.000000Z","device":"rxe1","change":"removed",)"
       R"("node":"uverbs1","loss":"removed"})",
       port_line("rxe0", IBV_EVENT_PORT_ACTIVE, 3)});
  const ibev_replay_attr attr = replay_attr(0);
  ReplayPtr replay(ibev_replay_create(dispatcher.get(), &attr));
  BOOST_REQUIRE_MESSAGE(replay, ibev_last_error());
  ibev_replay_stats stats{};
  BOOST_REQUIRE_MESSAGE(ibev_replay_play_file(replay.get(), path.c_str(), &stats) == 0,
                        ibev_last_error());
  BOOST_TEST(stats.injected == 2u);
  BOOST_TEST(stats.skipped == 1u);
  BOOST_TEST(stats.changes == 1u);
  BOOST_TEST(stats.stopped == 0);
  run_turns(dispatcher.get());
  BOOST_REQUIRE_EQUAL(heard.events.size(), 2u);
  BOOST_TEST(heard.events[0].code == IBV_EVENT_PORT_ERR);
  BOOST_TEST(heard.events[1].code == IBV_EVENT_PORT_ACTIVE);
  for (const ibev_event& e : heard.events) {
    BOOST_TEST(e.device == &device_stand_in);
    BOOST_TEST(e.element_kind == IBEV_ELEMENT_PORT);
    BOOST_TEST(e.port == 1);
    BOOST_TEST(e.synthesized == 1);
  }
}

BOOST_AUTO_TEST_CASE(attr_init_gives_the_recorded_pace) {
  ibev_replay_attr attr;
  std::memset(&attr, 0xff, sizeof attr);
  ibev_replay_attr_init(&attr);
  BOOST_TEST(attr.speed == 1.0);
  BOOST_TEST(attr.device == nullptr);
  BOOST_TEST(attr.context == nullptr);
  ibev_replay_attr_init(nullptr);  // ignored
  ibev_replay_stop(nullptr);
  ibev_replay_destroy(nullptr);
}

// Heard on the dispatcher's own thread while the test thread looks.
struct Counted {
  std::atomic<int> events{0};
  static void handler(const ibev_event*, void* context) { ++static_cast<Counted*>(context)->events; }
};

BOOST_AUTO_TEST_CASE(stop_from_another_thread_ends_a_play_waiting_on_a_long_gap) {
  DispatcherPtr dispatcher = make_dispatcher();
  Counted counted;
  HandlePtr listener(
      ibev_listen(dispatcher.get(), &device_stand_in, nullptr, &Counted::handler, &counted));
  BOOST_REQUIRE_MESSAGE(listener, ibev_last_error());
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_start(dispatcher.get()), 0);
  // An hour between the two events, at the recorded pace.
  const std::string path = recording_file(
      "gap.jsonl",
      {port_line("rxe0", IBV_EVENT_PORT_ERR, 0), port_line("rxe0", IBV_EVENT_PORT_ACTIVE, 3599)});
  const ibev_replay_attr attr = replay_attr(1);
  ReplayPtr replay(ibev_replay_create(dispatcher.get(), &attr));
  BOOST_REQUIRE_MESSAGE(replay, ibev_last_error());
  ibev_replay_stats stats{};
  auto playing = std::async(std::launch::async, [&] {
    return ibev_replay_play_file(replay.get(), path.c_str(), &stats);
  });
  // A failed REQUIRE below must not leave the future waiting out the hour.
  const std::unique_ptr<ibev_replay, Freed<ibev_replay_stop>> stop_on_exit(replay.get());
  // The first event heard: the play is in its gap (or about to be).
  BOOST_REQUIRE(ibev::testing::eventually([&] { return counted.events.load() == 1; }));
  BOOST_TEST((playing.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout));
  ibev_replay_stop(replay.get());
  BOOST_REQUIRE((playing.wait_for(std::chrono::seconds(10)) == std::future_status::ready));
  BOOST_TEST(playing.get() == 0);
  BOOST_TEST(stats.injected == 1u);
  BOOST_TEST(stats.stopped != 0);
  // And a later play returns at once, stopped too.
  ibev_replay_stats again{};
  BOOST_TEST(ibev_replay_play_file(replay.get(), path.c_str(), &again) == 0);
  BOOST_TEST(again.stopped != 0);
  BOOST_TEST(again.injected == 0u);
  BOOST_REQUIRE_EQUAL(ibev_dispatcher_stop(dispatcher.get()), 0);
}
