// A fuzz target with a bug for tools/fuzz.sh to find (fuzz_test.sh): an input
// beginning "bug" reads one byte past its copy, which ASan reports.
#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::uint8_t> copy(data, data + size);
  if (size >= 3 && copy[0] == 'b' && copy[1] == 'u' && copy[2] == 'g') {
    volatile std::uint8_t past = copy.data()[size];
    (void)past;
  }
  return 0;
}
