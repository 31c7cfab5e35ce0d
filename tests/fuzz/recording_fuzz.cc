// libFuzzer target: read_recording() (formats/recording.h) over any bytes.
// Bad input must end in the std::invalid_argument it documents; what it
// reads must survive the writer and the reader again (recording_check.h).
// tools/fuzz.sh builds and runs it.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ibev/formats/recording.h>

#include "tests/fuzz/recording_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::vector<ibev::RecordedLine> lines;
  try {
    lines = ibev::read_recording(in, "fuzz");
  } catch (const std::invalid_argument&) {
    return 0;
  }
  ibev::fuzz::check_round_trip(lines);
  return 0;
}
