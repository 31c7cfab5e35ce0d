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
  ibv_pd* pd = ibv_alloc_pd(device->require_open("ibv_alloc_pd"));
  if (pd == nullptr) throw_system_error("ibv_alloc_pd", errno);
  auto domain = std::make_shared<ProtectionDomain>(Token{}, device, pd);
  device->track(domain);
  return domain;
}

ProtectionDomain::ProtectionDomain(Token, std::shared_ptr<Device> device, ibv_pd* pd)
    : device_(std::move(device)), pd_(pd, device_->context(), &device_->registry()) {}

// Out of line, as every wrapper's: the destroy verb runs in libibev, never in
// code inlined into the application.
ProtectionDomain::~ProtectionDomain() = default;

void ProtectionDomain::close() noexcept { pd_.close(); }

// A domain of a lost device makes nothing more either.
ibv_pd* ProtectionDomain::require_open(const char* verb) const {
  device_->require_open(verb);
  return pd_.require(verb);
}

std::shared_ptr<MemoryRegion> MemoryRegion::create(std::shared_ptr<ProtectionDomain> pd,
                                                   void* address, std::size_t length,
                                                   int access) {
  if (!pd || address == nullptr || length == 0) {
    throw std::invalid_argument(
        "MemoryRegion::create: needs a domain, an address and a length");
  }
  ibv_mr* mr = ibv_reg_mr(pd->require_open("ibv_reg_mr"), address, length, access);
  if (mr == nullptr) throw_system_error("ibv_reg_mr", errno);
  auto region = std::make_shared<MemoryRegion>(Token{}, pd, mr);
  pd->device()->track(region);
  return region;
}

MemoryRegion::MemoryRegion(Token, std::shared_ptr<ProtectionDomain> pd, ibv_mr* mr)
    : pd_(std::move(pd)), mr_(mr, mr->context, &pd_->device()->registry()) {}

MemoryRegion::~MemoryRegion() = default;

void MemoryRegion::close() noexcept { mr_.close(); }

std::uint32_t MemoryRegion::lkey() const { return mr_.require("MemoryRegion::lkey")->lkey; }
std::uint32_t MemoryRegion::rkey() const { return mr_.require("MemoryRegion::rkey")->rkey; }

}  // namespace ibev
