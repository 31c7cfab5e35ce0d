// The routing primitive every callback list of ibev is made of (core/route.h,
// core/subscriber_lists.h): order, the snapshot rule, the wait rule
// of core/handle.h, failures reported (never fatal), executors, and both
// storages keeping the same semantics.
#define BOOST_TEST_MODULE ibev_route
#include <ibev/core/route.h>
#include <ibev/core/subscriber_lists.h>

#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using ibev::Failure;
using ibev::Handle;
using ibev::detail::BroadcastList;
using ibev::detail::KeyedLists;
using ibev::detail::ObjectKey;
using ibev::detail::Order;
using ibev::detail::Snapshot;
using namespace std::chrono_literals;
namespace data = boost::unit_test::data;

namespace {

// What a subscriber is told: where to write down that it ran.
using Seen = std::vector<int>*;
using Sub = ibev::detail::Subscriber<Seen>;

std::shared_ptr<Sub> writes(int i, ibev::Executor executor = {}) {
  return std::make_shared<Sub>([i](const Seen& seen) { seen->push_back(i); },
                               ibev::detail::AnyArg{}, std::move(executor));
}

// Delivers, collecting failures as "what ran: what".
std::size_t deliver(const Snapshot<Sub>& who, std::vector<int>& seen,
                    std::vector<std::string>* failures = nullptr,
                    Order order = Order::kRegistration) {
  return who.deliver(
      &seen, "test callback",
      [failures](const Failure& failure, const Seen&) {
        if (failures != nullptr) failures->push_back(failure.verb + ": " + failure.what);
      },
      order);
}

// Both storages behind one interface, for the cases they must agree on.
struct Lists {
  explicit Lists(bool keyed) : keyed(keyed) {}
  Handle add(std::shared_ptr<Sub> sub) {
    return keyed ? by_key.add(key, std::move(sub)) : broadcast.add(std::move(sub));
  }
  Snapshot<Sub> snapshot() const { return keyed ? by_key.snapshot(key) : broadcast.snapshot(); }

  const bool keyed;
  alignas(8) char object = 0;
  const ObjectKey key{&object, ibev::ElementKind::kQp};
  KeyedLists<Sub> by_key;
  BroadcastList<Sub> broadcast;
};

const auto kStorages = data::make({false, true});  // broadcast, keyed

}  // namespace

BOOST_DATA_TEST_CASE(calls_in_registration_order_or_reversed, kStorages * data::make({false, true}),
                     keyed, reverse) {
  Lists lists(keyed);
  std::vector<Handle> handles;
  for (int i = 1; i <= 3; ++i) handles.push_back(lists.add(writes(i)));
  std::vector<int> seen;
  BOOST_TEST(deliver(lists.snapshot(), seen, nullptr,
                     reverse ? Order::kReverse : Order::kRegistration) == 3u);
  const std::vector<int> expected =
      reverse ? std::vector<int>{3, 2, 1} : std::vector<int>{1, 2, 3};
  BOOST_TEST(seen == expected, boost::test_tools::per_element());
}

// The one snapshot rule, for both storages: a snapshot is who was subscribed
// when it was taken; one released since is skipped, one added since is not
// told.
BOOST_DATA_TEST_CASE(a_snapshot_is_who_was_subscribed_when_it_was_taken, kStorages, keyed) {
  Lists lists(keyed);
  Handle one = lists.add(writes(1));
  Handle two = lists.add(writes(2));
  const Snapshot<Sub> taken = lists.snapshot();
  two.release();
  Handle three = lists.add(writes(3));
  std::vector<int> seen;
  BOOST_TEST(deliver(taken, seen) == 1u);
  BOOST_TEST(seen == (std::vector<int>{1}), boost::test_tools::per_element());
  seen.clear();
  deliver(lists.snapshot(), seen);
  BOOST_TEST(seen == (std::vector<int>{1, 3}), boost::test_tools::per_element());
}

BOOST_DATA_TEST_CASE(a_callback_may_release_itself_and_a_later_one, kStorages, keyed) {
  Lists lists(keyed);
  Handle first, second, third;
  first = lists.add(std::make_shared<Sub>([&](const Seen& seen) {
    seen->push_back(1);
    first.release();  // its own: returns at once
    third.release();  // a later one: skipped in this very round
  }));
  second = lists.add(writes(2));
  third = lists.add(writes(3));
  std::vector<int> seen;
  deliver(lists.snapshot(), seen);
  deliver(lists.snapshot(), seen);
  BOOST_TEST(seen == (std::vector<int>{1, 2, 2}), boost::test_tools::per_element());
  second.release();
  BOOST_TEST(lists.snapshot().empty());
}

BOOST_DATA_TEST_CASE(release_waits_for_a_call_on_another_thread, kStorages, keyed) {
  Lists lists(keyed);
  std::promise<void> entered;
  std::atomic<bool> returned{false};
  Handle handle = lists.add(std::make_shared<Sub>([&](const Seen&) {
    entered.set_value();
    // Held 200 ms on purpose, a duration and no condition: the window in
    // which release() must not return. One that did not wait for this call
    // would return within microseconds (it only unlinks), so it would be
    // back long before `returned` is set.
    std::this_thread::sleep_for(200ms);
    returned = true;
  }));
  const Snapshot<Sub> taken = lists.snapshot();
  std::thread caller([&] {
    std::vector<int> seen;
    deliver(taken, seen);
  });
  entered.get_future().wait();
  handle.release();
  BOOST_TEST(returned.load());  // release returned only after the call did
  caller.join();
}

// A forked child letting go of a handle it inherited while a thread of the
// parent was inside the callback: that call is on a thread the child does
// not have, so waiting for it never ended (it used to, and the child hung).
// The child's release returns at once and touches nothing of the parent's.
BOOST_DATA_TEST_CASE(a_forked_child_releases_an_inherited_handle_without_waiting, kStorages,
                     keyed) {
  Lists lists(keyed);
  std::promise<void> entered, leave;
  std::shared_future<void> left = leave.get_future().share();
  Handle handle = lists.add(std::make_shared<Sub>([&](const Seen&) {
    entered.set_value();
    left.wait();
  }));
  const Snapshot<Sub> taken = lists.snapshot();
  std::thread caller([&] {
    std::vector<int> seen;
    deliver(taken, seen);
  });
  entered.get_future().wait();
  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(10);
    handle.release();
    ::_exit(handle.active() ? 1 : 0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  leave.set_value();
  caller.join();
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0),
             "the child ended with status " << status << " (SIGALRM: it waited)");
}

// What a callback throws, std::exception or not, is reported under the name
// given, and the others still run.
BOOST_DATA_TEST_CASE(a_throwing_callback_is_reported_and_the_others_run,
                     kStorages * data::make({false, true}), keyed, std_exception) {
  Lists lists(keyed);
  Handle a = lists.add(std::make_shared<Sub>([std_exception](const Seen&) {
    if (std_exception) throw std::runtime_error("boom");
    throw 42;
  }));
  Handle b = lists.add(writes(2));
  std::vector<int> seen;
  std::vector<std::string> failures;
  BOOST_TEST(deliver(lists.snapshot(), seen, &failures) == 2u);
  BOOST_TEST(seen == (std::vector<int>{2}), boost::test_tools::per_element());
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST(failures.front() ==
             (std_exception ? "test callback: boom"
                            : "test callback: an exception not derived from std::exception"));
}

BOOST_DATA_TEST_CASE(a_handle_outliving_its_list_releases_nothing, kStorages, keyed) {
  Handle handle;
  {
    Lists lists(keyed);
    handle = lists.add(writes(1));
  }
  handle.release();  // no crash, no wait
  BOOST_TEST(!handle.active());
}

// Released means gone: the callback's captures are destroyed when its handle
// is released (and no snapshot holds it), not when the list next tidies up.
BOOST_DATA_TEST_CASE(a_released_callback_s_captures_are_destroyed_at_once, kStorages, keyed) {
  Lists lists(keyed);
  auto captured = std::make_shared<int>(0);
  Handle handle = lists.add(std::make_shared<Sub>([captured](const Seen&) {}));
  BOOST_TEST(captured.use_count() == 2);
  handle.release();
  BOOST_TEST(captured.use_count() == 1);
}

// A subscriber with an executor is told through it; released before its task
// runs, it is not called; an executor that refuses (throws anything) is
// reported, never fatal.
BOOST_AUTO_TEST_CASE(an_executor_runs_the_call_and_a_refusal_is_reported) {
  std::vector<ibev::Task> queued;
  BroadcastList<Sub> list;
  Handle kept = list.add(writes(1, [&](ibev::Task task) { queued.push_back(std::move(task)); }));
  Handle dropped = list.add(writes(2, [&](ibev::Task task) { queued.push_back(std::move(task)); }));
  Handle refused = list.add(writes(3, [](ibev::Task) { throw 7; }));
  std::vector<int> seen;
  std::vector<std::string> failures;
  BOOST_TEST(deliver(list.snapshot(), seen, &failures) == 2u);  // two handed over
  BOOST_TEST(seen.empty());
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST(failures.front() ==
             "executor: the executor refused a handler's task: an exception not derived from "
             "std::exception");
  dropped.release();
  for (auto& task : queued) task();
  BOOST_TEST(seen == (std::vector<int>{1}), boost::test_tools::per_element());
}

// Keys do not share subscribers, and an object's several subscribers leave
// in any order.
BOOST_DATA_TEST_CASE(keyed_lists_keep_keys_apart_and_let_any_subscriber_leave,
                     data::make({0, 1, 2}), leaving) {
  KeyedLists<Sub> lists;
  alignas(8) char objects[16] = {};
  const ObjectKey a{&objects[0], ibev::ElementKind::kQp};
  const ObjectKey b{&objects[8], ibev::ElementKind::kQp};
  const ObjectKey a_as_cq{&objects[0], ibev::ElementKind::kCq};
  std::vector<Handle> on_a;
  for (int i = 0; i < 3; ++i) on_a.push_back(lists.add(a, writes(i)));
  Handle on_b = lists.add(b, writes(10));
  on_a[leaving].release();
  std::vector<int> seen;
  deliver(lists.snapshot(a), seen);
  std::vector<int> expected{0, 1, 2};
  expected.erase(expected.begin() + leaving);
  BOOST_TEST(seen == expected, boost::test_tools::per_element());
  seen.clear();
  deliver(lists.snapshot(b), seen);
  BOOST_TEST(seen == (std::vector<int>{10}), boost::test_tools::per_element());
  BOOST_TEST(lists.snapshot(a_as_cq).empty());
}

// The guard's enter() leaves on every way out, a throw included: a close()
// after it does not wait.
BOOST_AUTO_TEST_CASE(an_entered_call_is_left_on_every_way_out) {
  ibev::detail::CallGuard guard;
  try {
    const auto entered = guard.enter();
    BOOST_REQUIRE(static_cast<bool>(entered));
    BOOST_TEST(guard.running_here());
    throw std::runtime_error("out");
  } catch (const std::runtime_error&) {
  }
  BOOST_TEST(!guard.running_here());
  guard.close();
  guard.wait_idle();  // returns: nothing is entered
  BOOST_TEST(!static_cast<bool>(guard.enter()));
}

// A Handle made from a function: it runs once, on release() or at the end,
// and never again; moving hands it over without running it; the function may
// be move-only (here it holds another Handle, released with it); an empty
// one makes an inactive Handle, which releases nothing.
BOOST_AUTO_TEST_CASE(a_handle_from_a_function_releases_once) {
  int ran = 0;
  {
    Handle handle([&ran]() noexcept { ++ran; });
    BOOST_TEST(handle.active());
    Handle moved = std::move(handle);
    BOOST_TEST(!handle.active());  // NOLINT(bugprone-use-after-move): moved from, by design
    BOOST_TEST(ran == 0);
    moved.release();
    BOOST_TEST(ran == 1);
    BOOST_TEST(!moved.active());
    moved.release();
  }
  BOOST_TEST(ran == 1);

  int inner_ran = 0;
  {
    Handle inner([&inner_ran]() noexcept { ++inner_ran; });
    Handle outer([held = std::move(inner), &ran]() mutable noexcept {
      ++ran;
      held.release();
    });
    BOOST_TEST(inner_ran == 0);
  }
  BOOST_TEST(ran == 2);
  BOOST_TEST(inner_ran == 1);

  BOOST_TEST(!Handle(std::function<void()>{}).active());
  void (*none)() = nullptr;
  BOOST_TEST(!Handle(none).active());
  Handle assigned([&ran]() noexcept { ++ran; });
  assigned = Handle(std::function<void()>{});  // releases the first
  BOOST_TEST(ran == 3);
  BOOST_TEST(!assigned.active());
}
