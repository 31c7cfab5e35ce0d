// Devices that vanish and return, on soft-RoCE: an application holding QPs,
// CQs, an SRQ, a memory region and completion traffic (with a completion
// handler mid-call on a worker thread) must let `rdma link delete` and `ip
// link del` of the netdev complete, hear remove once, and pick the device up
// again when it is re-added. Each way of noticing (uevents, inotify, rescans)
// is tried. The kernel's delete blocks for as long as any process holds the
// device open (../shared/rxe-6.12-and-device-removal.md), so a hang here is
// the bug, bounded by a watch that closes everything and fails.
#define BOOST_TEST_MODULE ibev_softroce_device_lifecycle
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ibev/dispatch/worker_thread.h>
#include <ibev/verbs/device_clients.h>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"
#include "tests/support/testing.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;
namespace data = boost::unit_test::data;

namespace {

struct Removal {
  const char* name;
  const char* remove;  // {dev} and {net} are filled in
  const char* re_add;
};
std::ostream& operator<<(std::ostream& out, const Removal& r) { return out << r.name; }

const Removal kRemovals[] = {
    {"rdma link delete", "rdma link delete {dev}", "rdma link add {dev} type rxe netdev {net}"},
    {"ip link del", "ip link del {net}",
     "ip link add {net} type dummy && ip link set {net} up && "
     "rdma link add {dev} type rxe netdev {net}"},
};

std::string fill(std::string text) {
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"{dev}", test_device()}, {"{net}", test_netdev()}}) {
    for (auto at = text.find(key); at != std::string::npos; at = text.find(key)) {
      text.replace(at, key.size(), value);
    }
  }
  return text;
}

const DeviceMonitor kMonitors[] = {DeviceMonitor::kUevents, DeviceMonitor::kInotify,
                                   DeviceMonitor::kRescan};

}  // namespace

namespace ibev {
std::ostream& operator<<(std::ostream& out, DeviceMonitor monitor) {
  return out << to_string(monitor);
}
std::ostream& operator<<(std::ostream& out, DeviceLoss loss) { return out << to_string(loss); }
}  // namespace ibev

BOOST_DATA_TEST_CASE(a_delete_completes_while_held_and_a_re_add_resumes_traffic,
                     data::make(kMonitors) * data::make(kRemovals), monitor, removal) {
  FailureLog failures;
  Dispatcher dispatcher(failures.options(monitor));
  dispatcher.start();
  WorkerThread worker;
  std::atomic<int> completions{0};
  std::atomic<int> after_close{0};
  Lines log;
  std::mutex resources_mutex;
  std::map<Device*, std::unique_ptr<Workload>> resources;
  std::vector<std::shared_ptr<Device>> seen;  // every Device add named
  std::map<Device*, Handle> listeners;

  DeviceClients clients(dispatcher);
  BOOST_TEST(dispatcher.device_monitor() == monitor);
  Handle client = clients.register_client(
      {"app",
       [&](const std::shared_ptr<Device>& device) {
         auto made = std::make_unique<Workload>(device, worker.executor(), completions,
                                                 after_close);
         Handle listener = device->on_event(EventFilter{IBV_EVENT_DEVICE_FATAL},
                                            [&log](const Event& event) {
                                              log.add(std::string("DEVICE_FATAL ") +
                                                      std::string(to_string(event.loss())) +
                                                      (event.synthesized() ? " synthesized" : ""));
                                            });
         std::lock_guard<std::mutex> lock(resources_mutex);
         resources[device.get()] = std::move(made);
         listeners[device.get()] = std::move(listener);
         seen.push_back(device);
         log.add("add " + device->name());
       },
       [&](const std::shared_ptr<Device>& device, DeviceLoss loss) {
         std::unique_ptr<Workload> gone;
         {
           std::lock_guard<std::mutex> lock(resources_mutex);
           gone = std::move(resources[device.get()]);
           resources.erase(device.get());
         }
         log.add("remove " + device->name() + " " + std::string(to_string(loss)) +
                 (device->loss() == loss ? "" : " (the device does not say so)"));
         if (gone) gone->stop();
         // `gone` is dropped here: its objects are destroyed on this thread.
       }});

  BOOST_REQUIRE_MESSAGE(log.wait_count("add " + test_device(), 1, 20s), log.text());
  BOOST_REQUIRE_MESSAGE(grows_by(completions, 50), "no traffic before the delete");

  BlockingCommand deleting(fill(removal.remove));
  const auto took = deleting.wait(20s);
  if (!took) {
    // The bug itself: close everything so the kernel can finish, then fail.
    for (auto& device : clients.devices()) device->close();
    deleting.wait(60s);
    BOOST_FAIL(removal.name << " did not return within 20 s while ibev held the device:\n"
                            << log.text());
  }
  BOOST_TEST_MESSAGE(removal.name << " returned after " << took->count() << " ms ("
                                  << to_string(monitor) << ")");
  BOOST_TEST(log.count("remove " + test_device() + " removed") == 1u, log.text());
  BOOST_TEST(log.count("DEVICE_FATAL removed synthesized") == 1u, log.text());
  // The listeners first, then the clients' remove (device.h), although the
  // application's listener was registered after DeviceClients' own.
  const std::string text = log.text();
  BOOST_TEST(text.find("DEVICE_FATAL removed") < text.find("remove " + test_device()), text);
  BOOST_REQUIRE(!seen.empty());
  const std::shared_ptr<Device> old = seen.front();
  BOOST_TEST(old->loss() == DeviceLoss::kRemoved);
  BOOST_TEST(old->context() == nullptr);
  BOOST_TEST(clients.devices().empty());
  try {
    (void)ProtectionDomain::create(old);
    BOOST_ERROR("a removed device made a protection domain");
  } catch (const std::system_error& e) {
    BOOST_TEST(e.code().value() == ENODEV);
  }
  const int settled = completions.load();
  // No handler runs after its CQ closed.
  BOOST_TEST(stays_false_for(
      [&] { return completions.load() != settled || after_close.load() != 0; }, 200ms,
      "a handler still called would be called for traffic that ran every few milliseconds "
      "until the removal"));
  BOOST_TEST(completions.load() == settled, "completion handlers ran after their CQ closed");
  BOOST_TEST(after_close.load() == 0);

  // Re-plug: a new Device, a new add, traffic again; the old one stays dead.
  run_command(fill(removal.re_add));
  BOOST_REQUIRE_MESSAGE(log.wait_count("add " + test_device(), 2, 20s), log.text());
  BOOST_REQUIRE(seen.size() == 2u);
  BOOST_TEST(seen.back() != old);
  BOOST_TEST(seen.back()->context() != nullptr);
  BOOST_TEST(old->context() == nullptr);
  BOOST_TEST(grows_by(completions, 50), "no traffic after the re-add");
  BOOST_TEST(clients.devices().size() == 1u);

  client.release();
  {
    std::lock_guard<std::mutex> lock(resources_mutex);
    for (auto& [device, made] : resources) made->stop();
    resources.clear();
    listeners.clear();
  }
  BOOST_TEST(failures.lines().empty(), failures.summary());
}

// A forked child that drops what it inherited used to run the destroy verbs
// on the uverbs file it shares with the parent: the parent's QPs went to
// error under their traffic, the child hung, and the parent's device could
// not be deleted any more. Now everything a child inherited is inert there.
BOOST_AUTO_TEST_CASE(a_forked_child_dropping_what_it_inherited_leaves_the_parent_alone) {
  FailureLog failures;
  auto dispatcher = std::make_unique<Dispatcher>(failures.options(DeviceMonitor::kUevents));
  dispatcher->start();
  WorkerThread worker;
  std::atomic<int> completions{0};
  std::atomic<int> after_close{0};
  auto device = Device::open(*dispatcher, test_device());
  auto workload = std::make_unique<Workload>(device, worker.executor(), completions, after_close);
  BOOST_REQUIRE_MESSAGE(grows_by(completions, 50), "no traffic before the fork");

  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(20);  // a hang fails the parent's check below, not the suite
    workload.reset();
    device.reset();
    dispatcher.reset();
    ::_exit(0);
  }
  int status = 0;
  BOOST_REQUIRE(::waitpid(child, &status, 0) == child);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0),
             "the child did not exit cleanly (status " << status << ")");

  // The parent's objects are whole: its traffic goes on, its QP is in RTS.
  BOOST_TEST(grows_by(completions, 200), "the parent's traffic stopped when the child left");
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  BOOST_TEST(ibv_query_qp(workload->a->get(), &attr, IBV_QP_STATE, &init) == 0);
  BOOST_TEST(attr.qp_state == IBV_QPS_RTS);
  BOOST_TEST(after_close.load() == 0);

  // And its device can still be deleted while held (ibev closes it), then
  // re-added. The traffic stops where an application stops it, in the loss's
  // listener (an order TSan can see: the delete's own runs through the kernel).
  Handle stop_on_loss = device->on_event(EventFilter{IBV_EVENT_DEVICE_FATAL},
                                         [&workload](const Event&) { workload->stop(); });
  BlockingCommand deleting("rdma link delete " + test_device());
  if (!deleting.wait(20s)) {
    device->close();
    deleting.wait(60s);
    BOOST_FAIL("rdma link delete did not return within 20 s after the child left");
  }
  BOOST_TEST(device->loss() == DeviceLoss::kRemoved);
  stop_on_loss.release();  // waits for the listener: then `workload` is ours alone
  workload.reset();
  run_command("rdma link add " + test_device() + " type rxe netdev " + test_netdev());
  BOOST_TEST(failures.lines().empty(), failures.summary());
}

BOOST_AUTO_TEST_CASE(clients_hear_add_for_devices_present_and_unregister_inside_remove) {
  Dispatcher dispatcher;
  dispatcher.start();
  DeviceClients clients(dispatcher);
  Lines log;
  // The handles are set here and released on the dispatching thread: the
  // kernel's delete, between the two, is no ordering TSan can see.
  std::mutex handles;
  Handle first, second;
  const auto client = [&](const std::string& name, Handle& self) {
    return DeviceClient{name,
                        [&log, name](const std::shared_ptr<Device>& device) {
                          log.add(name + " add " + device->name());
                        },
                        [&log, &self, &handles, name](const std::shared_ptr<Device>& device,
                                                      DeviceLoss) {
                          {
                            std::lock_guard<std::mutex> lock(handles);
                            self.release();  // from inside its own callback
                          }
                          log.add(name + " remove " + device->name());
                        }};
  };
  {
    std::lock_guard<std::mutex> lock(handles);
    first = clients.register_client(client("first", first));
  }
  BOOST_REQUIRE_MESSAGE(log.wait_count("first add " + test_device(), 1, 20s), log.text());
  // Registered after the device exists: it hears add all the same, once.
  {
    std::lock_guard<std::mutex> lock(handles);
    second = clients.register_client(client("second", second));
  }
  BOOST_REQUIRE_MESSAGE(log.wait_count("second add " + test_device(), 1, 20s), log.text());
  // The first client hears no add again.
  BOOST_TEST(stays_false_for([&] { return log.count("first add " + test_device()) != 1u; }, 100ms,
                             "a second add would be called with the second client's, on the "
                             "same thread, just before or after it"));
  BOOST_TEST(log.count("first add " + test_device()) == 1u, log.text());

  BlockingCommand deleting(fill("rdma link delete {dev}"));
  BOOST_REQUIRE_MESSAGE(deleting.wait(20s), "the delete did not return");
  BOOST_REQUIRE_MESSAGE(log.wait_count("first remove " + test_device(), 1, 5s), log.text());
  // Reverse registration order, as ib_unregister_device calls remove.
  const std::string text = log.text();
  BOOST_TEST(text.find("second remove") < text.find("first remove"), text);
  {
    std::lock_guard<std::mutex> lock(handles);
    BOOST_TEST(!first.active());
    BOOST_TEST(!second.active());
  }

  // Unregistered: nobody hears the re-add.
  run_command(fill("rdma link add {dev} type rxe netdev {net}"));
  BOOST_TEST(eventually([&] { return !clients.devices().empty(); }));
  BOOST_TEST(clients.devices().size() == 1u);
  // With the device back, no unregistered client hears it.
  BOOST_TEST(stays_false_for([&] { return log.count("first add " + test_device()) != 1u; }, 1s,
                             "the Device is already made: an add would be called with its "
                             "making"));
  BOOST_TEST(log.count("first add " + test_device()) == 1u, log.text());
}

BOOST_AUTO_TEST_CASE(port_listeners_read_the_cached_port_already_refreshed) {
  Env env(test_device());
  Lines log;
  auto device = env.device;
  Handle listener = device->on_event(
      EventFilter{IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE, IBV_EVENT_GID_CHANGE},
      [&](const Event& event) {
        const CachedPort port = device->cached_port(static_cast<std::uint8_t>(*event.port()));
        std::string line = std::to_string(event.code()) + " " +
                           ibv_port_state_str(port.attributes.state);
        if (event.code() == IBV_EVENT_GID_CHANGE) {
          for (const ibv_gid_entry& gid : port.gids) {
            // fd00::77 added below.
            if (gid.gid.raw[0] == 0xfd && gid.gid.raw[15] == 0x77) line += " has fd00::77";
          }
        }
        log.add(line);
      });
  BOOST_TEST(device->port_count() == 1);
  BOOST_CHECK_THROW(device->cached_port(2), std::out_of_range);
  run_command("ip link set " + test_netdev() + " down");
  const auto line = [](int code, ibv_port_state state, const char* more = "") {
    return std::to_string(code) + " " + ibv_port_state_str(state) + more;
  };
  BOOST_REQUIRE_MESSAGE(log.wait_count(line(IBV_EVENT_PORT_ERR, IBV_PORT_DOWN), 1, 20s),
                        log.text());
  run_command("ip link set " + test_netdev() + " up");
  BOOST_REQUIRE_MESSAGE(log.wait_count(line(IBV_EVENT_PORT_ACTIVE, IBV_PORT_ACTIVE), 1, 20s),
                        log.text());
  run_command("ip -6 addr add fd00::77/64 dev " + test_netdev() + " nodad");
  BOOST_TEST(log.wait_count(line(IBV_EVENT_GID_CHANGE, IBV_PORT_ACTIVE, " has fd00::77"), 1, 20s),
             log.text());
  BOOST_TEST(env.errors().empty());
}

// Re-plug, again and again: each delete returns, each re-add is a new
// Device whose objects carry traffic, nothing leaks into the next.
BOOST_AUTO_TEST_CASE(five_deletes_and_re_adds_in_a_row) {
  FailureLog failures;
  Dispatcher dispatcher(failures.options());
  dispatcher.start();
  WorkerThread worker;
  std::atomic<int> completions{0};
  std::atomic<int> after_close{0};
  Lines log;
  std::mutex mutex;
  std::unique_ptr<Workload> workload;
  DeviceClients clients(dispatcher);
  Handle client = clients.register_client(
      {"app",
       [&](const std::shared_ptr<Device>& device) {
         auto made = std::make_unique<Workload>(device, worker.executor(), completions,
                                                after_close);
         std::lock_guard<std::mutex> lock(mutex);
         workload = std::move(made);
         log.add("add");
       },
       [&](const std::shared_ptr<Device>&, DeviceLoss) {
         std::unique_ptr<Workload> gone;
         {
           std::lock_guard<std::mutex> lock(mutex);
           gone = std::move(workload);
         }
         if (gone) gone->stop();
         log.add("remove");
       }});
  for (std::size_t round = 1; round <= 5; ++round) {
    BOOST_REQUIRE_MESSAGE(log.wait_count("add", round, 20s), "round " << round);
    BOOST_REQUIRE_MESSAGE(grows_by(completions, 20), "no traffic in round " << round);
    BlockingCommand deleting(fill("rdma link delete {dev}"));
    if (!deleting.wait(20s)) {
      for (auto& device : clients.devices()) device->close();
      deleting.wait(60s);
      BOOST_FAIL("the delete of round " << round << " hung");
    }
    BOOST_REQUIRE(log.wait_count("remove", round, 5s));
    run_command(fill("rdma link add {dev} type rxe netdev {net}"));
  }
  BOOST_REQUIRE(log.wait_count("add", 6, 20s));
  client.release();
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (workload) workload->stop();
    workload.reset();
  }
  BOOST_TEST(after_close.load() == 0);
  BOOST_TEST(failures.lines().empty(), failures.summary());
}
