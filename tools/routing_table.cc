// Routes one event of every type (and an unknown code) through a Registry with
// one handler per object kind and three device listeners, and prints who
// heard each one: the routing rules of docs/events.md, observed.
#include <cstdio>
#include <string>
#include <vector>

#include "core/registry.h"

namespace {

struct Recorder {
  std::vector<std::string> heard;
  ibev::Handler as(std::string who) {
    return [this, who](const ibev::Event&) { heard.push_back(who); };
  }
};

ibev::Event sample(ibv_context* device, int code, ibv_cq* cq, ibv_qp* qp,
                   ibv_srq* srq, ibv_wq* wq) {
  const auto* info = ibev::find_event_type(code);
  switch (info ? info->element : ibev::ElementKind::kDevice) {
    case ibev::ElementKind::kCq:
      return ibev::Event::synthesize(device, code, cq);
    case ibev::ElementKind::kQp:
      return ibev::Event::synthesize(device, code, qp);
    case ibev::ElementKind::kSrq:
      return ibev::Event::synthesize(device, code, srq);
    case ibev::ElementKind::kWq:
      return ibev::Event::synthesize(device, code, wq);
    case ibev::ElementKind::kPort:
      return ibev::Event::synthesize(device, code, ibev::Port{1});
    case ibev::ElementKind::kDevice:
      break;
  }
  return ibev::Event::synthesize(device, code, ibev::WholeDevice{});
}

}  // namespace

int main() {
  // Stand-in objects: the registry keys handlers by address only.
  ibv_context device{};
  ibv_cq cq{};
  ibv_qp qp{};
  ibv_srq srq{};
  ibv_wq wq{};

  ibev::Registry registry;
  Recorder recorder;
  std::vector<ibev::Attachment> held;
  held.push_back(registry.attach(&cq, recorder.as("cq handler")));
  held.push_back(registry.attach(&qp, recorder.as("qp handler")));
  held.push_back(registry.attach(&srq, recorder.as("srq handler")));
  held.push_back(registry.attach(&wq, recorder.as("wq handler")));
  held.push_back(registry.listen(&device, recorder.as("device listener")));
  held.push_back(registry.listen(&device, recorder.as("port-1 listener"),
                                 ibev::EventFilter().on_port(1)));
  held.push_back(registry.listen(&device, recorder.as("port-2 listener"),
                                 ibev::EventFilter().on_port(2)));
  held.push_back(registry.on_unclaimed(recorder.as("unclaimed")));

  std::printf("%-4s %-30s %-7s %-14s %s\n", "code", "event", "element",
              "severity", "heard by (events on port 1 or the objects above)");
  std::vector<int> codes;
  for (const auto& info : ibev::kEventTypes) codes.push_back(info.type);
  codes.push_back(42);  // a code from a kernel newer than this build
  for (int code : codes) {
    recorder.heard.clear();
    const ibev::Event event = sample(&device, code, &cq, &qp, &srq, &wq);
    registry.route(event);
    std::string heard;
    for (const auto& who : recorder.heard) {
      heard += (heard.empty() ? "" : ", ") + who;
    }
    const std::string name =
        event.known() ? std::string(event.info()->enumerator)
                      : "unknown code " + std::to_string(code);
    std::printf("%-4d %-30s %-7s %-14s %s\n", code, name.c_str(),
                std::string(ibev::to_string(event.element_kind())).c_str(),
                std::string(ibev::to_string(event.severity())).c_str(),
                heard.c_str());
  }
  return 0;
}
