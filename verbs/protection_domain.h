// ibev::ProtectionDomain (an ibv_pd) and ibev::MemoryRegion (an ibv_mr).
//
// Each keeps what it was made on alive (a domain its Device, a region its
// domain) and has an idempotent close() (verbs/ownership.h); Device::close()
// reaches both. Thread-safety: immutable after creation, but close() must not
// race with other use of the same object.
#ifndef IBEV_VERBS_PROTECTION_DOMAIN_H_
#define IBEV_VERBS_PROTECTION_DOMAIN_H_

#include <infiniband/verbs.h>

#include <cstddef>
#include <memory>

#include <ibev/verbs/device.h>
#include <ibev/verbs/ownership.h>

namespace ibev {

namespace detail {
inline constexpr char kDeallocPd[] = "ibv_dealloc_pd";
inline constexpr char kDeregMr[] = "ibv_dereg_mr";
}  // namespace detail

class ProtectionDomain : public detail::Closeable {
 public:
  // Throws std::invalid_argument (null device) or std::system_error
  // (ibv_alloc_pd; ENODEV for a closed device).
  static std::shared_ptr<ProtectionDomain> create(std::shared_ptr<Device> device);
  ~ProtectionDomain() override;

  // Null once closed.
  ibv_pd* get() const noexcept { return pd_.get(); }
  ibv_pd* require_open(const char* verb) const;
  const std::shared_ptr<Device>& device() const noexcept { return device_; }
  void close() noexcept override;

 private:
  struct Token {};

 public:
  ProtectionDomain(Token, std::shared_ptr<Device> device, ibv_pd* pd);

 private:
  std::shared_ptr<Device> device_;
  detail::Owned<ibv_pd, ibv_dealloc_pd, detail::kDeallocPd, 0> pd_;
};

// A registered memory region. The memory itself stays the caller's and must
// outlive the region.
class MemoryRegion : public detail::Closeable {
 public:
  // Throws std::invalid_argument (null domain or address, zero length) or
  // std::system_error (ibv_reg_mr).
  static std::shared_ptr<MemoryRegion> create(std::shared_ptr<ProtectionDomain> pd,
                                              void* address, std::size_t length,
                                              int access);
  ~MemoryRegion() override;

  // Null once closed.
  ibv_mr* get() const noexcept { return mr_.get(); }
  std::uint32_t lkey() const;
  std::uint32_t rkey() const;
  void close() noexcept override;

 private:
  struct Token {};

 public:
  MemoryRegion(Token, std::shared_ptr<ProtectionDomain> pd, ibv_mr* mr);

 private:
  std::shared_ptr<ProtectionDomain> pd_;
  detail::Owned<ibv_mr, ibv_dereg_mr, detail::kDeregMr, 0> mr_;
};

}  // namespace ibev

#endif  // IBEV_VERBS_PROTECTION_DOMAIN_H_
