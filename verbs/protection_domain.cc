#include <ibev/verbs/protection_domain.h>

#include <cerrno>
#include <stdexcept>
#include <utility>

namespace ibev {

std::shared_ptr<ProtectionDomain> ProtectionDomain::create(
    std::shared_ptr<Device> device) {
  if (!device) {
    throw std::invalid_argument("ProtectionDomain::create: the device is null");
  }
  ibv_pd* pd = ibv_alloc_pd(device->context());
  if (pd == nullptr) detail::throw_verb_error("ibv_alloc_pd", errno);
  return std::make_shared<ProtectionDomain>(Token{}, std::move(device), pd);
}

ProtectionDomain::ProtectionDomain(Token, std::shared_ptr<Device> device, ibv_pd* pd)
    : device_(std::move(device)), pd_(pd) {}

// Out of line, as every wrapper's: the destroy verb runs in libibev, never in
// code inlined into the application.
ProtectionDomain::~ProtectionDomain() = default;

std::unique_ptr<MemoryRegion> MemoryRegion::create(
    std::shared_ptr<ProtectionDomain> pd, void* address, std::size_t length,
    int access) {
  if (!pd || address == nullptr || length == 0) {
    throw std::invalid_argument(
        "MemoryRegion::create: needs a domain, an address and a length");
  }
  ibv_mr* mr = ibv_reg_mr(pd->get(), address, length, access);
  if (mr == nullptr) detail::throw_verb_error("ibv_reg_mr", errno);
  return std::make_unique<MemoryRegion>(Token{}, std::move(pd), mr);
}

MemoryRegion::MemoryRegion(Token, std::shared_ptr<ProtectionDomain> pd, ibv_mr* mr)
    : pd_(std::move(pd)), mr_(mr) {}

MemoryRegion::~MemoryRegion() = default;

}  // namespace ibev
