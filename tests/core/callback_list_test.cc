// The callback list behind device watchers and device clients: order, the
// wait rule of core/handle.h, and a throwing callback reported, not fatal.
#define BOOST_TEST_MODULE ibev_callback_list
#include <ibev/core/callback_list.h>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using ibev::Failure;
using ibev::Handle;
using List = ibev::detail::CallbackList<std::function<void(std::vector<int>&)>>;
using namespace std::chrono_literals;
namespace data = boost::unit_test::data;

namespace {

void call(const List& list, List::Order order, std::vector<int>& seen,
          std::vector<std::string>* failures = nullptr) {
  list.call_each(
      order, [&](const auto& callback) { callback(seen); },
      [failures](const Failure& failure) {
        if (failures != nullptr) failures->push_back(failure.verb + ": " + failure.what);
      },
      "test callback");
}

}  // namespace

BOOST_DATA_TEST_CASE(calls_in_the_order_asked, data::make({false, true}), reverse) {
  const auto order = reverse ? List::Order::kReverse : List::Order::kRegistration;
  const std::vector<int> expected = reverse ? std::vector<int>{3, 2, 1} : std::vector<int>{1, 2, 3};
  List list;
  std::vector<Handle> handles;
  for (int i = 1; i <= 3; ++i) handles.push_back(list.add([i](std::vector<int>& seen) {
    seen.push_back(i);
  }));
  std::vector<int> seen;
  call(list, order, seen);
  BOOST_TEST(seen == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_callback_may_release_itself_and_a_later_one) {
  List list;
  Handle first, second, third;
  first = list.add([&](std::vector<int>& seen) {
    seen.push_back(1);
    first.release();  // its own: returns at once
    third.release();  // a later one: skipped in this very round
  });
  second = list.add([](std::vector<int>& seen) { seen.push_back(2); });
  third = list.add([](std::vector<int>& seen) { seen.push_back(3); });
  std::vector<int> seen;
  call(list, List::Order::kRegistration, seen);
  call(list, List::Order::kRegistration, seen);
  BOOST_TEST(seen == (std::vector<int>{1, 2, 2}), boost::test_tools::per_element());
  BOOST_TEST(!list.empty());
  second.release();
  BOOST_TEST(list.empty());
}

BOOST_AUTO_TEST_CASE(release_waits_for_a_call_on_another_thread) {
  List list;
  std::promise<void> entered;
  std::atomic<bool> returned{false};
  Handle handle = list.add([&](std::vector<int>&) {
    entered.set_value();
    // Proves an absence: release() does not return during these 200 ms.
    std::this_thread::sleep_for(200ms);
    returned = true;
  });
  std::thread caller([&] {
    std::vector<int> seen;
    call(list, List::Order::kRegistration, seen);
  });
  entered.get_future().wait();
  handle.release();
  BOOST_TEST(returned.load());  // release returned only after the call did
  caller.join();
}

BOOST_AUTO_TEST_CASE(a_throwing_callback_is_reported_and_the_others_run) {
  List list;
  Handle a = list.add([](std::vector<int>&) { throw std::runtime_error("boom"); });
  Handle b = list.add([](std::vector<int>& seen) { seen.push_back(2); });
  std::vector<int> seen;
  std::vector<std::string> failures;
  call(list, List::Order::kRegistration, seen, &failures);
  BOOST_TEST(seen == (std::vector<int>{2}), boost::test_tools::per_element());
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST(failures.front() == "test callback: boom");
}

BOOST_AUTO_TEST_CASE(a_handle_outliving_its_list_releases_nothing) {
  Handle handle;
  {
    List list;
    handle = list.add([](std::vector<int>&) {});
  }
  handle.release();  // no crash, no wait
  BOOST_TEST(!handle.active());
}
