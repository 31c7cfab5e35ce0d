// Two devices, one removed: rxe1 goes (and comes back) while rxe0 carries
// traffic and port events; rxe0's objects, handlers and events are untouched.
#define BOOST_TEST_MODULE ibev_softroce_device_removal_two_devices
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <ibev/dispatch/worker_thread.h>
#include <ibev/verbs/device_clients.h>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(removing_one_device_leaves_the_other_untouched) {
  FailureLog failures;
  Dispatcher dispatcher(failures.options());
  dispatcher.start();
  WorkerThread worker;
  Lines log;
  std::atomic<int> completions{0};
  std::atomic<int> after_close{0};
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<Workload>> workloads;  // rxe0's only
  std::map<std::string, Handle> listeners;

  DeviceClients clients(dispatcher);
  Handle client = clients.register_client(
      {"app",
       [&](const std::shared_ptr<Device>& device) {
         Handle listener = device->on_event({}, [&log, name = device->name()](const Event& e) {
           log.add(name + " " + std::to_string(e.code()));
         });
         std::lock_guard<std::mutex> lock(mutex);
         listeners[device->name()] = std::move(listener);
         if (device->name() == test_device()) {
           workloads[device->name()] =
               std::make_unique<Workload>(device, worker.executor(), completions, after_close);
         }
         log.add("add " + device->name());
       },
       [&](const std::shared_ptr<Device>& device, DeviceLoss loss) {
         std::lock_guard<std::mutex> lock(mutex);
         listeners.erase(device->name());
         if (auto it = workloads.find(device->name()); it != workloads.end()) {
           it->second->stop();
           workloads.erase(it);
         }
         log.add("remove " + device->name() + " " + std::string(to_string(loss)));
       }});
  BOOST_REQUIRE_MESSAGE(log.wait_count("add " + test_device(), 1, 20s), log.text());
  BOOST_REQUIRE_MESSAGE(log.wait_count("add " + test_device2(), 1, 20s), log.text());
  BOOST_REQUIRE(grows_by(completions, 50));

  BlockingCommand deleting("rdma link delete " + test_device2());
  if (!deleting.wait(20s)) {
    for (auto& device : clients.devices()) device->close();
    deleting.wait(60s);
    BOOST_FAIL("the delete of " << test_device2() << " hung:\n" << log.text());
  }
  BOOST_REQUIRE_MESSAGE(log.wait_count("remove " + test_device2() + " removed", 1, 5s),
                        log.text());
  BOOST_TEST(log.count("remove " + test_device() + " removed") == 0u, log.text());
  const std::string fatal = std::to_string(IBV_EVENT_DEVICE_FATAL);
  BOOST_TEST(log.count(test_device2() + " " + fatal) == 1u, log.text());
  BOOST_TEST(log.count(test_device() + " " + fatal) == 0u, log.text());

  // rxe0: its traffic flows on, its port events still come.
  BOOST_TEST(grows_by(completions, 50));
  auto devices = clients.devices();
  BOOST_REQUIRE(devices.size() == 1u);
  BOOST_TEST(devices.front()->name() == test_device());
  BOOST_TEST((devices.front()->loss() == DeviceLoss::kNone));
  run_command("ip link set " + test_netdev() + " down");
  run_command("ip link set " + test_netdev() + " up");
  BOOST_TEST(log.wait_count(test_device() + " " + std::to_string(IBV_EVENT_PORT_ACTIVE), 1, 20s),
             log.text());

  run_command("rdma link add " + test_device2() + " type rxe netdev " + test_netdev2());
  BOOST_TEST(log.wait_count("add " + test_device2(), 2, 20s), log.text());
  BOOST_TEST(clients.devices().size() == 2u);
  BOOST_TEST(after_close.load() == 0);

  client.release();
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [name, workload] : workloads) workload->stop();
    workloads.clear();
    listeners.clear();
  }
  BOOST_TEST(failures.lines().empty(), failures.summary());
}
