// ibev-watch on a real device: against ibv_asyncwatch, both running while the
// netdev flaps and gains an IPv6 address, they must report the same events
// in the same order; then SIGTERM: ibev-watch exits 0 after printing its
// counts. Also its option forms and its word for a device it may not open.
// The binary's path comes after "--" on the command line.
#define BOOST_TEST_MODULE ibev_softroce_ibev_watch
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <thread>
#include <string>
#include <vector>

#include "apps/ibev_watch/journal.h"
#include "tests/softroce/rdma_fixture.h"
#include "tests/support/testing.h"

using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

std::string ibev_watch_path() {
  const auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_REQUIRE_MESSAGE(suite.argc >= 2, "pass the ibev-watch binary after --");
  return suite.argv[1];
}

std::vector<Seen> matches(const std::string& text, const std::regex& pattern) {
  std::vector<Seen> seen;
  for (std::sregex_iterator it(text.begin(), text.end(), pattern), end; it != end; ++it) {
    seen.push_back({std::stoi((*it)[1]), std::stoi((*it)[2])});
  }
  return seen;
}

// {"time":...,"device":"rxe0","event":"IBV_EVENT_PORT_ERR","code":10,"scope":"port","port":1,...}
const std::regex kIbevLine(
    R"re("device":"rxe0","event":"[^"]+","code":(\d+),"scope":"port","port":(\d+))re");
// "  event_type IBV_EVENT_PORT_ERR (10), port 1"
const std::regex kAsyncwatchLine(R"(event_type \S+ \((\d+)\), port (\d+))");

}  // namespace

BOOST_AUTO_TEST_CASE(agrees_with_ibv_asyncwatch) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  Spawned asyncwatch("stdbuf -oL ibv_asyncwatch -d " + device, tmp + "/asyncwatch.out");
  Spawned ibev_watch(ibev_watch_path() + " --json --count -d " + device, tmp + "/ibev_watch.out");
  BOOST_REQUIRE_MESSAGE(asyncwatch.wait_for_text("async event FD", 20s),
                        "ibv_asyncwatch: " << asyncwatch.text());
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device, 20s),
                        "ibev-watch: " << ibev_watch.text());

  const std::string netdev = test_netdev();
  run_command("ip link set " + netdev + " down");
  run_command("ip link set " + netdev + " up");
  run_command("ip -6 addr add fd00::55/64 dev " + netdev + " nodad");

  eventually(
      [&] {
        return matches(asyncwatch.text(), kAsyncwatchLine).size() >= 3 &&
               matches(ibev_watch.text(), kIbevLine).size() >= 3;
      },
      20s, 20ms);
  // Both finish printing. A duration, not a condition: rxe may raise more
  // than three events for these changes (PORT_ERR for the admin down and
  // again for the carrier), how many is the kernel's to say, and all come
  // within milliseconds of the change; 500 ms on, both outputs are whole,
  // and they are compared whole below.
  std::this_thread::sleep_for(500ms);
  const int status = ibev_watch.stop();
  asyncwatch.stop();
  BOOST_TEST_MESSAGE("ibev-watch printed:\n" << ibev_watch.text());
  BOOST_TEST_MESSAGE("ibv_asyncwatch printed:\n" << asyncwatch.text());

  const auto theirs = matches(asyncwatch.text(), kAsyncwatchLine);
  const auto ours = matches(ibev_watch.text(), kIbevLine);
  BOOST_TEST(theirs.size() >= 3u);
  BOOST_TEST(ours == theirs, boost::test_tools::per_element());
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);

  // --count agrees with the lines.
  std::map<std::string, int> lines, counted;
  const std::regex event_name(R"re("device":"rxe0","event":"([^"]+)","code")re");
  const std::string text = ibev_watch.text();
  for (std::sregex_iterator it(text.begin(), text.end(), event_name), end; it != end; ++it) {
    ++lines[(*it)[1]];
  }
  const std::regex count_line(R"re(\{"count":(\d+),"device":"rxe0","event":"([^"]+)"\})re");
  for (std::sregex_iterator it(text.begin(), text.end(), count_line), end; it != end; ++it) {
    counted[(*it)[2]] = std::stoi((*it)[1]);
  }
  BOOST_TEST(counted == lines);
}

namespace {

// Runs `command` through /bin/sh, its stdout and stderr into one text;
// returns the exit status.
int run_capturing(const std::string& command, std::string& output) {
  const std::string file = env_or("TEST_TMPDIR", "/tmp") + "/captured.out";
  const int status = std::system((command + " >" + file + " 2>&1").c_str());
  std::ifstream in(file);
  output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

// rdma-core's option forms: -dNAME glued, short options combined; a device
// named twice is watched once, so each event is printed once.
BOOST_AUTO_TEST_CASE(short_forms_and_a_device_named_twice) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  Spawned ibev_watch(ibev_watch_path() + " -jc -d" + device + " --device=" + device,
                     tmp + "/ibev_watch_short.out");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device + " (", 20s),
                        "ibev-watch: " << ibev_watch.text());
  run_command("ip link set " + test_netdev() + " down");
  BOOST_REQUIRE(ibev_watch.wait_for_text("IBV_EVENT_PORT_ERR", 20s));
  // Not watched twice: a duration, not a condition, as rxe may raise
  // PORT_ERR more than once (below); a device watched twice prints each
  // event twice, the second within milliseconds of the first, and the counts
  // below are of what 500 ms brought.
  std::this_thread::sleep_for(500ms);
  const int status = ibev_watch.stop();
  run_command("ip link set " + test_netdev() + " up");
  // rxe may raise PORT_ERR more than once for one down (admin, carrier); a
  // device watched twice would print each of them twice and count twice.
  const std::string text = ibev_watch.text();
  const auto count = [&](const std::regex& pattern) {
    return std::distance(std::sregex_iterator(text.begin(), text.end(), pattern),
                         std::sregex_iterator());
  };
  const long lines = count(std::regex(R"re("event":"IBV_EVENT_PORT_ERR","code")re"));
  std::smatch counted;
  const std::regex count_line(
      R"re(\{"count":(\d+),"device":"[^"]+","event":"IBV_EVENT_PORT_ERR"\})re");
  BOOST_TEST(count(count_line) == 1, text);
  BOOST_REQUIRE_MESSAGE(std::regex_search(text, counted, count_line), text);
  BOOST_TEST(lines == std::stol(counted[1]), text);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);
}

// A device the user may not open is told apart from a missing device and from
// a kernel without RDMA: exit 2 and a message naming permission.
BOOST_AUTO_TEST_CASE(no_permission_is_said_plainly) {
  // uverbs nodes are 0666 by default; take that away for the test.
  run_command("chmod 0600 /dev/infiniband/uverbs*");
  std::string output;
  const int status = run_capturing("setpriv --reuid=65534 --regid=65534 --clear-groups " +
                                       ibev_watch_path() + " -d " + test_device(),
                                   output);
  run_command("chmod 0666 /dev/infiniband/uverbs*");
  BOOST_TEST(status == 2, output);
  BOOST_TEST(output.find("no permission to open " + test_device()) != std::string::npos, output);

  const int missing = run_capturing(ibev_watch_path() + " -d nosuchdevice", output);
  BOOST_TEST(missing == 2);
  BOOST_TEST(output.find("no RDMA device named nosuchdevice") != std::string::npos);
}

// Never pins a device: a delete while it runs returns, both changes are
// printed, and the re-added device is watched again (its events printed).
BOOST_AUTO_TEST_CASE(a_delete_and_a_re_add_while_it_runs) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  Spawned ibev_watch(ibev_watch_path() + " --json --count", tmp + "/ibev_watch_replug.out");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device, 20s),
                        "ibev-watch: " << ibev_watch.text());
  BOOST_TEST(ibev_watch.text().find("and devices added later") != std::string::npos);

  BlockingCommand deleting("rdma link delete " + device);
  if (!deleting.wait(20s)) {
    ibev_watch.stop();  // lets the kernel finish
    deleting.wait(60s);
    BOOST_FAIL("rdma link delete did not return while ibev-watch ran:\n" << ibev_watch.text());
  }
  const std::string removed = R"("device":")" + device + R"(","change":"removed")";
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text(removed, 20s), ibev_watch.text());

  run_command("rdma link add " + device + " type rxe netdev " + test_netdev());
  const std::string added = R"("device":")" + device + R"(","change":"added")";
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_count(added, 2, 20s) == 2, ibev_watch.text());
  run_command("ip link set " + test_netdev() + " down");
  run_command("ip link set " + test_netdev() + " up");
  BOOST_TEST(ibev_watch.wait_for_text("IBV_EVENT_PORT_ACTIVE", 20s), ibev_watch.text());
  const int status = ibev_watch.stop();
  const std::string text = ibev_watch.text();
  BOOST_TEST(text.find(R"("loss":"removed","synthesized":true)") != std::string::npos, text);
  // The counts span both lives of the device: the synthesized DEVICE_FATAL
  // of the first, the port events of the second.
  BOOST_TEST(text.find(R"({"count":1,"device":")" + device +
                       R"(","event":"IBV_EVENT_DEVICE_FATAL"})") != std::string::npos,
             text);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);
}

namespace {

// The value of PromQL `query` as Prometheus answers it now (its HTTP API), or
// "" when it has no sample.
std::string prometheus_query(const std::string& query) {
  // curl, not a Python one-liner: under TCG, Python's start-up per query
  // made this case take 48 s; with curl it takes 27 s.
  std::string output;
  run_capturing("curl -sS --max-time 10 -G --data-urlencode 'query=" + query +
                    "' http://127.0.0.1:9390/api/v1/query",
                output);
  // Each sample of the answer's vector is "value":[TIME,"VALUE"].
  static const std::regex sample(R"re("value":\[[-+.0-9eE]+,"([^"]*)"\])re");
  std::string values;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), sample);
       it != std::sregex_iterator(); ++it) {
    values += (values.empty() ? "" : " ") + (*it)[1].str();
  }
  return values;
}

// ibev-watch's /metrics now.
std::string scrape() {
  std::string output;
  run_capturing("curl -sS --max-time 10 http://127.0.0.1:9391/metrics", output);
  return output;
}

}  // namespace

// The fleet view: a real Prometheus server scrapes ibev-watch while the
// netdev flaps, a GID is added and the device is deleted (with scrapes
// running through the delete, which must still return) and re-added; what
// Prometheus stored must be what ibev-watch printed. The textfile and the
// endpoint both pass promtool's check.
BOOST_AUTO_TEST_CASE(prometheus_stores_what_it_printed) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  const std::string textfile = tmp + "/ibev.prom";
  Spawned ibev_watch(ibev_watch_path() + " --json --metrics-listen 127.0.0.1:9391 " +
                         "--metrics-textfile " + textfile,
                     tmp + "/ibev_watch_metrics.out");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device, 20s),
                        "ibev-watch: " << ibev_watch.text());
  BOOST_TEST(ibev_watch.text().find("serving metrics on http://127.0.0.1:9391/metrics") !=
             std::string::npos);

  std::ofstream(tmp + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
         "scrape_configs:\n  - job_name: ibev\n    static_configs:\n"
         "      - targets: ['127.0.0.1:9391']\n";
  // Its storage mmaps files, which the VM's 9p share (TEST_TMPDIR) cannot.
  char storage[] = "/tmp/ibev-prometheus.XXXXXX";
  BOOST_REQUIRE(mkdtemp(storage) != nullptr);
  Spawned prometheus("prometheus --config.file=" + tmp + "/prometheus.yml --storage.tsdb.path=" +
                         storage + " --web.listen-address=127.0.0.1:9390",
                     tmp + "/prometheus.out");
  BOOST_REQUIRE_MESSAGE(prometheus.wait_for_text("Server is ready to receive web requests", 60s),
                        "prometheus: " << prometheus.text());

  const std::string netdev = test_netdev();
  run_command("ip link set " + netdev + " down");
  run_command("ip link set " + netdev + " up");
  run_command("ip -6 addr add fd00::56/64 dev " + netdev + " nodad");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("IBV_EVENT_GID_CHANGE", 20s), ibev_watch.text());

  // Scrapes back to back through the delete: none may hold it up.
  std::atomic<bool> deleting_done{false};
  std::atomic<int> scrapes{0};
  std::thread scraper([&] {
    while (!deleting_done) {
      scrape();
      ++scrapes;
    }
  });
  BlockingCommand deleting("rdma link delete " + device);
  const bool deleted = deleting.wait(20s).has_value();
  deleting_done = true;
  scraper.join();
  if (!deleted) {
    ibev_watch.stop();
    deleting.wait(60s);
    BOOST_FAIL("rdma link delete did not return while ibev-watch was scraped");
  }
  BOOST_TEST_MESSAGE(scrapes << " scrapes during the delete");
  const std::string removed = R"("device":")" + device + R"(","change":"removed")";
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text(removed, 20s), ibev_watch.text());
  run_command("rdma link add " + device + " type rxe netdev " + netdev);
  const std::string added = R"("device":")" + device + R"(","change":"added")";
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_count(added, 2, 20s) == 2, ibev_watch.text());

  // What Prometheus stores once it scraped after the last change.
  const std::string flaps =
      "ibev_watch_events_total{device=\"" + device + "\",event=\"IBV_EVENT_PORT_ERR\"}";
  const std::string printed_errs = std::to_string(
      count_of(ibev_watch.text(), R"("device":")" + device + R"(","event":"IBV_EVENT_PORT_ERR")"));
  const std::string additions = "ibev_watch_device_additions_total{device=\"" + device + "\"}";
  const std::string gid_query = "sum(ibev_watch_events_total{event=\"IBV_EVENT_GID_CHANGE\"})";
  const std::string port_query = "ibev_port_state{device=\"" + device + "\",port=\"1\"}";
  const auto printed = [&](const char* event) {
    return std::to_string(
        count_of(ibev_watch.text(), R"("device":")" + device + R"(","event":")" + event + "\""));
  };
  // Until Prometheus scraped after the last event ibev-watch printed.
  eventually(
      [&] {
        return prometheus_query(additions) == "2" &&
               prometheus_query(flaps) == printed("IBV_EVENT_PORT_ERR") &&
               prometheus_query(gid_query) == printed("IBV_EVENT_GID_CHANGE") &&
               prometheus_query(port_query) == "4";
      },
      30s, 250ms);
  BOOST_TEST(prometheus_query(additions) == "2");
  BOOST_TEST(prometheus_query(flaps) == printed_errs, ibev_watch.text());
  BOOST_TEST(prometheus_query("ibev_watch_device_removals_total{device=\"" + device +
                              "\",reason=\"removed\"}") == "1");
  BOOST_TEST(prometheus_query(gid_query) == printed("IBV_EVENT_GID_CHANGE"));
  BOOST_TEST(prometheus_query("ibev_watch_devices") == "1");
  BOOST_TEST(prometheus_query("ibev_watch_up") == "1");
  BOOST_TEST(prometheus_query(port_query) == "4");
  BOOST_TEST(prometheus_query("ibev_watch_scrape_errors_total") == "0");

  // The format, as Prometheus's checker reads it: the endpoint's and the file's.
  std::ofstream(tmp + "/scraped.prom") << scrape();
  std::string report;
  BOOST_TEST(run_capturing("promtool check metrics <" + tmp + "/scraped.prom", report) == 0,
             report);
  BOOST_TEST(run_capturing("promtool check metrics <" + textfile, report) == 0, report);
  BOOST_TEST(
      count_of(run_capturing("cat " + textfile, report) == 0 ? report : "", additions + " 2") == 1,
      report);

  prometheus.stop();
  run_command(std::string("rm -rf ") + storage);
  run_command("ip -6 addr del fd00::56/64 dev " + netdev);
  const int status = ibev_watch.stop();
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);
}

// Bad metrics input is a clear error and exit 1, before anything is watched.
BOOST_AUTO_TEST_CASE(an_unusable_metrics_address_or_file_exits_1) {
  std::string output;
  Spawned holder(ibev_watch_path() + " --metrics-listen 127.0.0.1:9392",
                 env_or("TEST_TMPDIR", "/tmp") + "/holder.out");
  BOOST_REQUIRE(holder.wait_for_text("serving metrics", 20s));
  BOOST_TEST(run_capturing(ibev_watch_path() + " --metrics-listen 127.0.0.1:9392", output) == 1);
  BOOST_TEST(output.find("cannot expose metrics: bind 127.0.0.1:9392: Address already in use") !=
                 std::string::npos,
             output);
  holder.stop();
  BOOST_TEST(run_capturing(ibev_watch_path() + " --metrics-listen 127.0.0.1", output) == 1);
  BOOST_TEST(output.find("expected HOST:PORT") != std::string::npos, output);
  BOOST_TEST(run_capturing(ibev_watch_path() + " --metrics-listen nohost:9100", output) == 1);
  BOOST_TEST(output.find("not an IP address") != std::string::npos, output);
  BOOST_TEST(run_capturing(ibev_watch_path() + " --metrics-textfile /no/such/dir/x.prom", output) ==
             1);
  BOOST_TEST(
      output.find("open /no/such/dir/x.prom.tmp: No such file or directory") != std::string::npos,
      output);
}

// --journal where no journald runs (the VM's init is not systemd, like a
// container's): sd_journal_send takes each entry and drops it, so ibev-watch
// says so once and prints the lines on stdout instead (they were lost).
BOOST_AUTO_TEST_CASE(journal_not_there_lines_go_to_stdout) {
  if (ibev::watch::journal_reachable() == 0) {
    BOOST_TEST_MESSAGE("a journald listens here: nothing to test");
    return;
  }
  // A socket file a stopped journald left would answer ECONNREFUSED; the
  // case that lost every entry is the file not being there at all.
  run_command(std::string("rm -f ") + ibev::watch::kJournalSocket);
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  Spawned ibev_watch(ibev_watch_path() + " --journal -d " + device, tmp + "/ibev_watch_nj.out");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device, 20s),
                        ibev_watch.text());
  run_command("ip link set " + test_netdev() + " down");
  run_command("ip link set " + test_netdev() + " up");
  BOOST_TEST(ibev_watch.wait_for_text(device + " port 1 IBV_EVENT_PORT_ACTIVE", 20s),
             ibev_watch.text());
  const int status = ibev_watch.stop();
  const std::string text = ibev_watch.text();
  BOOST_TEST(text.find(device + " port 1 IBV_EVENT_PORT_ERR") != std::string::npos, text);
  BOOST_TEST(ibev_watch.wait_for_count("cannot write to the systemd journal", 2, 0ms) == 1, text);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);
}

// --journal: entries reach a journal (systemd-journald run by hand: the VM
// has no systemd as PID 1) with the fields journalctl matches on.
BOOST_AUTO_TEST_CASE(journal_entries_carry_the_rdma_fields) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  run_command("mkdir -p /run/systemd/journal /run/log/journal");
  // journald needs the cgroup hierarchy, which the VM's init does not mount.
  if (access("/sys/fs/cgroup/cgroup.controllers", F_OK) != 0) {
    run_command("mount -t cgroup2 none /sys/fs/cgroup");
  }
  // A host with systemd has its journald running: that one takes the entries.
  std::optional<Spawned> journald;
  if (access("/run/systemd/journal/socket", F_OK) != 0) {
    journald.emplace("/lib/systemd/systemd-journald", tmp + "/journald.out");
  }
  eventually([] { return access("/run/systemd/journal/socket", F_OK) == 0; }, 20s, 50ms);
  BOOST_REQUIRE_MESSAGE(access("/run/systemd/journal/socket", F_OK) == 0,
                        (journald ? journald->text() : std::string()));
  const std::string device = test_device();
  Spawned ibev_watch(ibev_watch_path() + " --journal -d " + device, tmp + "/ibev_watch_j.out");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device, 20s),
                        ibev_watch.text());
  run_command("ip link set " + test_netdev() + " down");
  run_command("ip link set " + test_netdev() + " up");
  std::string entries;
  eventually(
      [&] {
        run_capturing("journalctl --no-pager -o json RDMA_EVENT=IBV_EVENT_PORT_ERR", entries);
        return entries.find("IBV_EVENT_PORT_ERR") != std::string::npos;
      },
      20s, 100ms);
  BOOST_TEST(entries.find("\"RDMA_DEVICE\":\"" + device + "\"") != std::string::npos, entries);
  BOOST_TEST(entries.find("\"RDMA_PORT\":\"1\"") != std::string::npos, entries);
  BOOST_TEST(entries.find("\"RDMA_ELEMENT\":\"port\"") != std::string::npos, entries);
  BOOST_TEST(entries.find("\"PRIORITY\":\"3\"") != std::string::npos, entries);
  BOOST_TEST(entries.find("\"SYSLOG_IDENTIFIER\":\"ibev-watch\"") != std::string::npos, entries);
  run_capturing("journalctl --no-pager -o json RDMA_CHANGE=added RDMA_DEVICE=" + device, entries);
  BOOST_TEST(entries.find("\"PRIORITY\":\"5\"") != std::string::npos, entries);
  // Nothing printed on stdout: the journal took every line.
  const int status = ibev_watch.stop();
  BOOST_TEST(ibev_watch.text().find("IBV_EVENT_PORT_ERR") == std::string::npos, ibev_watch.text());
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);
}

// With -d, a device not named comes and goes unnoticed: no line, no count, no
// metric (its removal once printed a line and took the device gauge below 0).
BOOST_AUTO_TEST_CASE(a_device_not_named_is_not_removed_either) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  const std::string netdev = test_netdev();
  Spawned ibev_watch(
      ibev_watch_path() + " --json -c -d " + device + " --metrics-listen 127.0.0.1:9393",
      tmp + "/ibev_watch_named.out");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device, 20s),
                        ibev_watch.text());
  // One rxe device per netdev: the other comes and goes while this one is away.
  run_command("rdma link delete " + device);
  BOOST_REQUIRE(ibev_watch.wait_for_text(R"("change":"removed")", 20s));
  run_command("rdma link add other0 type rxe netdev " + netdev);
  // ibev-watch's DeviceClients open it meanwhile. A duration, not a
  // condition: ibev-watch prints and counts nothing of a device not named
  // (what is under test), so there is nothing to wait on.
  std::this_thread::sleep_for(1s);
  std::string while_there;
  run_capturing("curl -sS --max-time 10 http://127.0.0.1:9393/metrics", while_there);
  run_command("rdma link delete other0");
  std::this_thread::sleep_for(1s);  // and close it (a duration, as above)
  run_command("rdma link add " + device + " type rxe netdev " + netdev);
  const std::string added = R"("device":")" + device + R"(","change":"added")";
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_count(added, 2, 20s) == 2, ibev_watch.text());
  std::string metrics;
  run_capturing("curl -sS --max-time 10 http://127.0.0.1:9393/metrics", metrics);
  const int status = ibev_watch.stop();
  BOOST_TEST(ibev_watch.text().find("other0") == std::string::npos, ibev_watch.text());
  BOOST_TEST(metrics.find("\nibev_watch_devices 1\n") != std::string::npos, metrics);
  BOOST_TEST(metrics.find("other0") == std::string::npos, metrics);
  // Not in the library's figures either while it was there.
  BOOST_TEST(while_there.find("other0") == std::string::npos, while_there);
  BOOST_TEST(while_there.find("\nibev_watch_devices 0\n") != std::string::npos, while_there);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);
}
