// The fault-injection schedule (formats/fault_schedule.h): every fault reads, and
// becomes the events a real one raises; malformed lines are refused with
// their place.
#define BOOST_TEST_MODULE ibev_fault_schedule
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>

#include <ibev/formats/fault_schedule.h>

using ibev::Fault;
using namespace std::chrono_literals;

namespace {

std::vector<Fault> read(const std::string& text) {
  std::istringstream in(text);
  return ibev::read_fault_schedule(in, "faults.txt");
}

const char kSchedule[] =
    "# at    fault       device  argument\n"
    "0s      port-down   rxe0    1          # the link goes down\n"
    "\n"
    "1.5s    port-up     rxe0    1\n"
    "2s      gid-change  rxe0    2\n"
    "2500ms  qp-fatal    rxe0    0x11\n"
    "3s      remove      rxe0\n"
    "4s      add         rxe0    d0\n"
    "5s      netem       rxe0    loss=20% delay=30ms reorder=10%\n"
    "6500ms  netem-off   rxe0\n"
    "7s      listener-close rxe1\n"
    "8s      listener-open  rxe1\n"
    "9s      peer-kill      rxe1\n"
    "10s     peer-start     rxe1\n";

}  // namespace

BOOST_AUTO_TEST_CASE(every_fault_reads) {
  const auto faults = read(kSchedule);
  BOOST_REQUIRE_EQUAL(faults.size(), 12u);
  BOOST_TEST((faults[0].kind == Fault::Kind::kPortDown && faults[0].number == 1u));
  BOOST_TEST((faults[1].at == 1500ms && faults[1].kind == Fault::Kind::kPortUp));
  BOOST_TEST((faults[2].kind == Fault::Kind::kGidChange && faults[2].number == 2u));
  BOOST_TEST((faults[3].at == 2500ms && faults[3].number == 0x11u));
  BOOST_TEST((faults[4].kind == Fault::Kind::kRemove && faults[4].device == "rxe0"));
  BOOST_TEST((faults[5].kind == Fault::Kind::kAdd && faults[5].netdev == "d0"));
  BOOST_TEST(faults[5].line == 8);
  BOOST_TEST((faults[6].kind == Fault::Kind::kNetem && faults[6].device == "rxe0"));
  BOOST_TEST((faults[6].netem.loss == std::optional<double>(20)));
  BOOST_TEST((faults[6].netem.delay == std::optional<std::chrono::microseconds>(30ms)));
  BOOST_TEST((faults[6].netem.reorder == std::optional<double>(10)));
  BOOST_TEST((faults[7].at == 6500ms && faults[7].kind == Fault::Kind::kNetemOff));
  BOOST_TEST(ibev::to_string(Fault::Kind::kNetemOff) == "netem-off");
  BOOST_TEST((faults[8].at == 7s && faults[8].kind == Fault::Kind::kListenerClose));
  BOOST_TEST((faults[8].device == "rxe1" && faults[8].number == 0u && faults[8].netdev.empty()));
  BOOST_TEST((faults[9].at == 8s && faults[9].kind == Fault::Kind::kListenerOpen));
  BOOST_TEST(faults[9].line == 12);
  BOOST_TEST(ibev::to_string(Fault::Kind::kListenerClose) == "listener-close");
  BOOST_TEST(ibev::to_string(Fault::Kind::kListenerOpen) == "listener-open");
  BOOST_TEST((faults[10].at == 9s && faults[10].kind == Fault::Kind::kPeerKill));
  BOOST_TEST(
      (faults[10].device == "rxe1" && faults[10].number == 0u && faults[10].netdev.empty()));
  BOOST_TEST((faults[11].at == 10s && faults[11].kind == Fault::Kind::kPeerStart));
  BOOST_TEST(faults[11].line == 14);
  BOOST_TEST(ibev::to_string(Fault::Kind::kPeerKill) == "peer-kill");
  BOOST_TEST(ibev::to_string(Fault::Kind::kPeerStart) == "peer-start");
}

namespace {
struct NetemLine {
  const char* keys;
  ibev::NetemSpec netem;
};
std::ostream& operator<<(std::ostream& out, const NetemLine& n) { return out << n.keys; }
ibev::NetemSpec netem(std::optional<double> loss, std::optional<std::chrono::microseconds> delay,
                      std::optional<double> reorder) {
  return ibev::NetemSpec{loss, delay, reorder};
}
constexpr auto kNone = std::nullopt;
const NetemLine kNetemLines[] = {
    {"loss=20%", netem(20, kNone, kNone)},
    {"delay=30ms", netem(kNone, 30ms, kNone)},
    {"reorder=25% delay=1.5ms", netem(kNone, 1500us, 25)},  // any order
    {"loss=0% delay=0s", netem(0, 0us, kNone)},
    {"loss=100% delay=10s reorder=100%", netem(100, 10s, 100)},
    {"loss=0.5% delay=10000ms", netem(0.5, 10s, kNone)},
    {"loss=.25% delay=0.001ms reorder=0%", netem(0.25, 1us, 0)},
};
}  // namespace

// Each key alone or with the others, in any order, at its bounds.
BOOST_DATA_TEST_CASE(a_netem_reads_its_keys, boost::unit_test::data::make(kNetemLines), n) {
  const auto faults = read(std::string("1s netem rxe0 ") + n.keys + "\n");
  BOOST_REQUIRE_EQUAL(faults.size(), 1u);
  BOOST_TEST((faults[0].kind == Fault::Kind::kNetem));
  BOOST_TEST((faults[0].netem == n.netem));
  BOOST_TEST(faults[0].number == 0u);
}

BOOST_AUTO_TEST_CASE(faults_become_the_events_real_ones_raise) {
  const auto start = ibev::RecordingClock::now();
  const auto lines = ibev::to_recording(read(kSchedule), start);
  BOOST_REQUIRE_EQUAL(lines.size(), 7u);  // remove is an event and a change
  const auto event = [&](std::size_t i) { return std::get<ibev::RecordedEvent>(lines[i]); };
  BOOST_TEST(event(0).code == IBV_EVENT_PORT_ERR);
  BOOST_TEST((event(0).port == std::optional<int>(1)));
  BOOST_TEST(event(1).code == IBV_EVENT_PORT_ACTIVE);
  BOOST_TEST((event(1).time == start + 1500ms));
  BOOST_TEST(event(2).code == IBV_EVENT_GID_CHANGE);
  BOOST_TEST(event(3).code == IBV_EVENT_QP_FATAL);
  BOOST_TEST((event(3).kind == ibev::ElementKind::kQp));
  BOOST_TEST((event(3).number == std::optional<std::uint32_t>(0x11)));
  BOOST_TEST(event(4).code == IBV_EVENT_DEVICE_FATAL);
  BOOST_TEST((event(4).loss == ibev::DeviceLoss::kRemoved));
  BOOST_TEST(!std::get<ibev::RecordedChange>(lines[5]).added);
  BOOST_TEST(std::get<ibev::RecordedChange>(lines[6]).added);
  // The netem and its netem-off, the listener's close and open and the
  // peer's kill and start (the program's own, which it does itself), raise
  // no event: nothing after the add.
}

struct Bad {
  const char* text;
  const char* why;
};
std::ostream& operator<<(std::ostream& out, const Bad& b) { return out << b.text; }

const Bad kBad[] = {
    {"1s port-down\n", "faults.txt:1: expected: TIME FAULT DEVICE"},
    {"1 port-down rxe0 1\n", "faults.txt:1: the time '1' is not N[.N]s or N[.N]ms"},
    {"-1s port-down rxe0 1\n", "the time '-1s' is not"},
    {"1s port-down rxe0 1\n0.5s port-up rxe0 1\n", "faults.txt:2: the time 0.5s goes back"},
    {"1s reboot rxe0\n", "faults.txt:1: unknown fault 'reboot'"},
    {"1s port-down rxe0 0\n", "the port '0' is not a number from 1 to 255"},
    {"1s port-down rxe0\n", "port-down takes DEVICE and a port"},
    {"1s remove rxe0 1\n", "remove takes DEVICE only"},
    {"1s qp-fatal rxe0 0x1000000\n", "the QP number '0x1000000' is not a number"},
    {"1s add rxe0\n", "add takes DEVICE and a netdev"},
    {"1s port-down rxe0 +1\n", "the port '+1' is not a number"},
    {"1e3s port-down rxe0 1\n", "the time '1e3s' is not"},
    {"40000000s port-down rxe0 1\n", "up to a year"},
    // Found by tests/fuzz/fault_schedule_fuzz.cc: bytes that are not UTF-8
    // made a recording its reader refuses.
    {"1s port-down rx\xec" "e0 1\n", "the device 'rx\xec" "e0' is not a name of printable ASCII"},
    {"1s add rxe0 d\x80\n", "the netdev 'd\x80' is not a name of printable ASCII"},
    {"1s netem rxe0\n", "faults.txt:1: netem takes DEVICE and loss=N%, delay=TIME or reorder=N%"},
    {"1s netem rxe0 loss\n", "netem's 'loss' is not loss=N%, delay=TIME or reorder=N%"},
    {"1s netem rxe0 jitter=5ms\n", "netem's 'jitter=5ms' is not loss=N%"},
    {"1s netem rxe0 1\n", "netem's '1' is not loss=N%"},
    {"1s netem rxe0 loss=1% loss=2%\n", "netem's loss is given twice"},
    {"1s netem rxe0 loss=20\n", "the loss '20' is not N[.N]% from 0 to 100"},
    {"1s netem rxe0 loss=100.5%\n", "the loss '100.5%' is not N[.N]% from 0 to 100"},
    {"1s netem rxe0 loss=-1%\n", "the loss '-1%' is not"},
    {"1s netem rxe0 loss=%\n", "the loss '%' is not"},
    {"1s netem rxe0 loss=1e1%\n", "the loss '1e1%' is not"},
    {"1s netem rxe0 loss=1.2.3%\n", "the loss '1.2.3%' is not"},
    {"1s netem rxe0 loss=\n", "the loss '' is not"},
    {"1s netem rxe0 reorder=nan%\n", "the reorder 'nan%' is not"},
    {"1s netem rxe0 delay=30\n", "the delay '30' is not N[.N]s or N[.N]ms, up to 10 s"},
    {"1s netem rxe0 delay=10.001s\n", "the delay '10.001s' is not N[.N]s or N[.N]ms, up to 10 s"},
    {"1s netem rxe0 reorder=10%\n", "faults.txt:1: netem's reorder needs a delay above 0"},
    {"1s netem rxe0 reorder=10% delay=0ms\n", "netem's reorder needs a delay above 0"},
    {"1s netem-off rxe0 1\n", "netem-off takes DEVICE only"},
    {"1s netem-off\n", "faults.txt:1: expected: TIME FAULT DEVICE"},
    {"1s listener-close rxe1 1\n", "faults.txt:1: listener-close takes DEVICE only"},
    {"1s listener-open rxe1 4791\n", "faults.txt:1: listener-open takes DEVICE only"},
    {"1s listener-open\n", "faults.txt:1: expected: TIME FAULT DEVICE"},
    {"1s listener-close rx\x01" "e1\n",
     "the device 'rx\x01" "e1' is not a name of printable ASCII"},
    {"1s peer-kill rxe1 9\n", "faults.txt:1: peer-kill takes DEVICE only"},
    {"1s peer-start rxe1 4791\n", "faults.txt:1: peer-start takes DEVICE only"},
    {"1s peer-kill\n", "faults.txt:1: expected: TIME FAULT DEVICE"},
    {"1s listener-shut rxe1\n",
     "faults.txt:1: unknown fault 'listener-shut' (port-down, port-up, gid-change, qp-fatal, "
     "remove, add, netem, netem-off, listener-close, listener-open, peer-kill, peer-start)"},
};

BOOST_DATA_TEST_CASE(a_bad_line_is_refused_with_its_place, boost::unit_test::data::make(kBad), b) {
  try {
    read(b.text);
    BOOST_FAIL("read: " << b.text);
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find(b.why) != std::string::npos, e.what());
  }
}

namespace {

Fault fault(std::chrono::microseconds at, Fault::Kind kind, std::string device,
            std::uint32_t number = 0, std::string netdev = "") {
  Fault made;
  made.at = at;
  made.kind = kind;
  made.device = std::move(device);
  made.number = number;
  made.netdev = std::move(netdev);
  return made;
}

Fault netem_fault(std::chrono::microseconds at, std::string device, ibev::NetemSpec spec) {
  Fault made = fault(at, Fault::Kind::kNetem, std::move(device));
  made.netem = spec;
  return made;
}

struct Written {
  const char* name;
  std::vector<Fault> faults;
};
std::ostream& operator<<(std::ostream& out, const Written& w) { return out << w.name; }

using K = Fault::Kind;
const Written kWritten[] = {
    {"none", {}},
    {"every fault",
     {fault(0us, K::kPortDown, "rxe0", 1), fault(1500ms, K::kPortUp, "rxe0", 1),
      fault(2s, K::kGidChange, "rxe0", 2), fault(2500ms, K::kQpFatal, "rxe0", 0x11),
      fault(3s, K::kRemove, "rxe0"), fault(4s, K::kAdd, "rxe0", 0, "d0")}},
    {"times to the microsecond",
     {fault(1us, K::kPortDown, "rxe1", 255), fault(999us, K::kPortUp, "rxe1", 255),
      fault(1001us, K::kGidChange, "rxe1", 1), fault(1010us, K::kGidChange, "rxe1", 1),
      fault(123456789us, K::kRemove, "rxe1")}},
    {"QP numbers at both ends, faults at one time",
     {fault(7ms, K::kQpFatal, "a.b-c_d", 0), fault(7ms, K::kQpFatal, "a.b-c_d", 0xffffff)}},
    {"netems",
     {netem_fault(0us, "rxe0", netem(20, 30ms, 10)),
      netem_fault(1s, "rxe0", netem(1, kNone, kNone)),
      netem_fault(1s, "rxe1", netem(kNone, 1us, kNone)),
      netem_fault(2s, "rxe1", netem(kNone, 10s, 100)), fault(3s, K::kNetemOff, "rxe0"),
      fault(3s, K::kNetemOff, "rxe1")}},
    {"listener faults",
     {fault(0us, K::kListenerClose, "rxe1"), fault(1500ms, K::kListenerOpen, "rxe1"),
      fault(1500ms, K::kListenerClose, "mlx5_0"), fault(4001001us, K::kListenerOpen, "mlx5_0")}},
    {"peer faults",
     {fault(0us, K::kPeerKill, "rxe1"), fault(100ms, K::kPeerStart, "rxe1"),
      fault(100ms, K::kPeerKill, "mlx5_0"), fault(2000001us, K::kPeerStart, "mlx5_0")}},
    // Each written in the fewest digits that read back the same double.
    {"percentages to the last bit",
     {netem_fault(0us, "rxe0", netem(0.1, 1001us, 1.0 / 3)),
      netem_fault(1us, "rxe0", netem(100, 0us, kNone)),
      netem_fault(2us, "rxe0", netem(4.9406564584124654e-324, kNone, kNone)),
      netem_fault(3us, "rxe0", netem(99.999999999999986, 1us, 2.2250738585072014e-308))}},
    {"a year, the longest",
     {fault(0us, K::kRemove, "rxe0"),
      fault(std::chrono::seconds(366 * 86400), K::kAdd, "rxe0", 0, "veth-7")}},
};

}  // namespace

// What the writer writes, the reader reads back as it was, each fault's line
// its place: a schedule a program makes (a campaign's, shrunk) is one
// ibev-replay and ibev::Replay play.
BOOST_DATA_TEST_CASE(a_written_schedule_reads_back_the_same, boost::unit_test::data::make(kWritten),
                     w) {
  std::ostringstream out;
  ibev::write_fault_schedule(out, w.faults);
  const auto back = read(out.str());
  BOOST_REQUIRE_EQUAL(back.size(), w.faults.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    const Fault& want = w.faults[i];
    BOOST_TEST_CONTEXT("fault " << i + 1 << " written as: " << out.str()) {
      BOOST_TEST(back[i].at.count() == want.at.count());
      BOOST_TEST((back[i].kind == want.kind));
      BOOST_TEST(back[i].device == want.device);
      BOOST_TEST(back[i].number == want.number);
      BOOST_TEST(back[i].netdev == want.netdev);
      BOOST_TEST((back[i].netem == want.netem));
      BOOST_TEST(back[i].line == static_cast<int>(i + 1));
    }
  }
}

struct Unwritable {
  const char* name;
  std::vector<Fault> faults;
  const char* why;
};
std::ostream& operator<<(std::ostream& out, const Unwritable& u) { return out << u.name; }

const Unwritable kUnwritable[] = {
    {"back in time",
     {fault(2s, K::kPortDown, "rxe0", 1), fault(1s, K::kPortUp, "rxe0", 1)},
     "fault 2: its time goes back"},
    {"before 0", {fault(-1us, K::kPortDown, "rxe0", 1)}, "fault 1: its time goes back"},
    {"past a year",
     {fault(std::chrono::seconds(366 * 86400) + 1us, K::kRemove, "rxe0")},
     "past a year"},
    {"port 0", {fault(0us, K::kPortDown, "rxe0", 0)}, "the port is not from 1 to 255"},
    {"port 256", {fault(0us, K::kGidChange, "rxe0", 256)}, "the port is not from 1 to 255"},
    {"a QP number past 24 bits", {fault(0us, K::kQpFatal, "rxe0", 0x1000000)}, "past 24 bits"},
    {"no device", {fault(0us, K::kRemove, "")}, "the device '' is not one word"},
    {"a device with a space", {fault(0us, K::kRemove, "rxe 0")}, "is not one word"},
    {"a device with a comment", {fault(0us, K::kRemove, "rxe#0")}, "is not one word"},
    {"an add with no netdev", {fault(0us, K::kAdd, "rxe0")}, "the netdev '' is not one word"},
    {"a listener-close with no device",
     {fault(0us, K::kListenerClose, "")},
     "fault 1: the device '' is not one word"},
    {"a listener-open on a device with a space",
     {fault(0us, K::kListenerOpen, "rxe 1")},
     "fault 1: the device 'rxe 1' is not one word"},
    {"a peer-kill with no device",
     {fault(0us, K::kPeerKill, "")},
     "fault 1: the device '' is not one word"},
    {"a netem of nothing", {fault(0us, K::kNetem, "rxe0")}, "fault 1: a netem of nothing"},
    {"a loss past 100 %",
     {netem_fault(0us, "rxe0", netem(100.5, kNone, kNone))},
     "a netem's percentage is not from 0 to 100"},
    {"a reorder below 0",
     {netem_fault(0us, "rxe0", netem(kNone, 1ms, -1))},
     "a netem's percentage is not from 0 to 100"},
    {"a loss of -0 (written \"-0%\", which the reader refuses)",
     {netem_fault(0us, "rxe0", netem(-0.0, kNone, kNone))},
     "a netem's percentage is not from 0 to 100"},
    {"a loss not a number",
     {netem_fault(0us, "rxe0", netem(std::nan(""), kNone, kNone))},
     "a netem's percentage is not from 0 to 100"},
    {"a delay past 10 s",
     {netem_fault(0us, "rxe0", netem(kNone, 10s + 1us, kNone))},
     "a netem's delay is below 0 or past 10 s"},
    {"a delay below 0",
     {netem_fault(0us, "rxe0", netem(kNone, -1us, kNone))},
     "a netem's delay is below 0 or past 10 s"},
    {"a reorder with no delay",
     {netem_fault(0us, "rxe0", netem(kNone, kNone, 5))},
     "a netem's reorder has no delay above 0"},
    {"a reorder with a delay of 0",
     {netem_fault(0us, "rxe0", netem(kNone, 0us, 5))},
     "a netem's reorder has no delay above 0"},
};

// What the reader could not read back is refused, and nothing is written.
BOOST_DATA_TEST_CASE(an_unreadable_schedule_is_not_written,
                     boost::unit_test::data::make(kUnwritable), u) {
  std::ostringstream out;
  try {
    ibev::write_fault_schedule(out, u.faults);
    BOOST_FAIL("written: " << out.str());
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find(u.why) != std::string::npos, e.what());
  }
  BOOST_TEST(out.str().empty());
}
