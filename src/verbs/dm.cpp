// Device memory (ibv_alloc_dm(3)): a software device has no on-chip memory, so a DM is host memory
// with the verbs' rules and an honest budget: at most kMaxDmSize bytes per device in one process,
// counted in 64-byte blocks, reached only through ibv_memcpy_to/from_dm (4-byte granularity, as on
// hardware) and through zero-based MRs registered with ibv_reg_dm_mr.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {
constexpr uint64_t kDmBlock = 64;     // allocation granularity
constexpr uint64_t kDmCopyAlign = 4;  // offsets and lengths of ibv_memcpy_to/from_dm
constexpr uint32_t kMaxLogAlign = 12; // the buffer starts on a page

inline SoftDm* to_dm(ibv_dm* d) { return reinterpret_cast<SoftDm*>(d); }

// EINVAL unless [offset, offset+length) lies in the DM and both are multiples of 4.
int check_copy(const DmBuffer& b, uint64_t offset, size_t length) {
  if (b.destroyed.load()) return EINVAL;
  if (offset % kDmCopyAlign || length % kDmCopyAlign) return EINVAL;
  if (offset > b.length || length > b.length - offset) return EINVAL;
  return 0;
}

int memcpy_to_dm(ibv_dm* dm, uint64_t offset, const void* src, size_t length) {
  DmBuffer& b = *to_dm(dm)->buf;
  if (int rc = check_copy(b, offset, length)) return rc;
  if (length) std::memcpy(b.base + offset, src, length);
  return 0;
}

int memcpy_from_dm(void* dst, ibv_dm* dm, uint64_t offset, size_t length) {
  DmBuffer& b = *to_dm(dm)->buf;
  if (int rc = check_copy(b, offset, length)) return rc;
  if (length) std::memcpy(dst, b.base + offset, length);
  return 0;
}

bool charge(SoftDevice& d, uint64_t bytes) {
  uint64_t used = d.dm_used.load();
  do {
    if (bytes > kMaxDmSize - used) return false;
  } while (!d.dm_used.compare_exchange_weak(used, used + bytes));
  return true;
}

SoftDm* new_dm_object(ibv_context* ctx, std::shared_ptr<DmBuffer> buf, uint32_t handle, bool imported) {
  auto* d = new (std::nothrow) SoftDm{};
  if (!d) return nullptr;
  d->dm.context = ctx;
  d->dm.memcpy_to_dm = memcpy_to_dm;
  d->dm.memcpy_from_dm = memcpy_from_dm;
  d->dm.comp_mask = 0;
  d->dm.handle = handle;
  d->buf = std::move(buf);
  d->imported = imported;
  return d;
}
}  // namespace

namespace softrdma::verbs {

DmBuffer::~DmBuffer() {
  if (base) munmap(base, map_len);
  if (charged && device) device->dm_used -= charged;
}

ibv_dm* alloc_dm(ibv_context* ctx, ibv_alloc_dm_attr* attr) {
  if (!attr || attr->comp_mask || attr->length == 0 || attr->log_align_req > kMaxLogAlign) {
    errno = EINVAL;
    return nullptr;
  }
  SoftDevice& dev = *to_ctx(ctx)->device;
  if (attr->length > kMaxDmSize) {
    errno = ENOMEM;
    return nullptr;
  }
  const uint64_t bytes = (attr->length + kDmBlock - 1) / kDmBlock * kDmBlock;
  if (!charge(dev, bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  std::shared_ptr<DmBuffer> buf;
  try {
    buf = std::make_shared<DmBuffer>();
  } catch (const std::bad_alloc&) {
    dev.dm_used -= bytes;
    errno = ENOMEM;
    return nullptr;
  }
  buf->device = &dev;
  buf->charged = bytes;  // from here the buffer gives the bytes back
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  buf->length = attr->length;
  buf->map_len = (attr->length + page - 1) / page * page;
  // Private anonymous pages, as any heap buffer: registering an MR on them makes them shareable with
  // intra-host peers for the direct path (transport/direct_share.h), and a fork copies them.
  void* p = mmap(nullptr, buf->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    errno = ENOMEM;
    return nullptr;
  }
  buf->base = static_cast<uint8_t*>(p);
  const uint32_t handle = to_ctx(ctx)->next_handle.fetch_add(1);
  SoftDm* d = new_dm_object(ctx, buf, handle, false);
  if (!d) {
    errno = ENOMEM;
    return nullptr;
  }
  ContextShared& sh = *to_ctx(ctx)->shared;
  try {
    std::lock_guard lock(sh.mu);
    sh.dms_by_handle[handle] = buf;
  } catch (const std::bad_alloc&) {
    delete d;
    errno = ENOMEM;
    return nullptr;
  }
  return &d->dm;
}

// Frees the device memory, through the original or an import of it; refused while MRs are on it.
int free_dm(ibv_dm* dm) {
  SoftDm* d = to_dm(dm);
  ContextShared& sh = *to_ctx(dm->context)->shared;
  std::lock_guard lock(sh.mu);
  DmBuffer& b = *d->buf;
  if (b.destroyed.load()) return EINVAL;  // an import of a DM already freed: only unimport is left
  if (b.mrs.load()) return EBUSY;
  b.destroyed = true;
  // The budget comes back now; the pages when the last import of them goes.
  b.device->dm_used -= b.charged;
  b.charged = 0;
  sh.dms_by_handle.erase(dm->handle);
  delete d;
  return 0;
}

ibv_mr* reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned int access) {
  SoftDm* d = to_dm(dm);
  DmBuffer& b = *d->buf;
  // A DM MR is zero based (ibv_alloc_dm(3)): its addresses are offsets from its first byte.
  if (!(access & IBV_ACCESS_ZERO_BASED) || (access & IBV_ACCESS_ON_DEMAND) ||
      ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
      b.destroyed.load() || offset > b.length || length > b.length - offset ||
      to_ctx(dm->context)->shared != to_ctx(pd->context)->shared) {
    errno = EINVAL;
    return nullptr;
  }
  auto* m = new (std::nothrow) SoftMr{};
  if (!m) {
    errno = ENOMEM;
    return nullptr;
  }
  m->region.addr = reinterpret_cast<uint64_t>(b.base + offset);
  m->region.iova = 0;
  m->region.length = length;
  m->region.access = access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
  m->region.pd = pd->handle;
  if (!engine_of(pd->context).register_mr(m->region)) {
    delete m;
    errno = ENOMEM;
    return nullptr;
  }
  ++to_pd(pd)->users;
  ++b.mrs;
  m->dm = d->buf;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = nullptr;  // zero based: the DM's pages have no address the application may use
  m->mr.length = length;
  m->mr.handle = m->region.lkey;
  m->mr.lkey = m->region.lkey;
  m->mr.rkey = m->region.rkey;
  publish_mr(m);
  return &m->mr;
}

}  // namespace softrdma::verbs

SOFTRDMA_EXPORT ibv_dm* ibv_import_dm(ibv_context* ctx, uint32_t handle) {
  ContextShared& sh = *to_ctx(ctx)->shared;
  std::lock_guard lock(sh.mu);
  auto it = sh.dms_by_handle.find(handle);
  if (it == sh.dms_by_handle.end()) {
    errno = ENOENT;
    return nullptr;
  }
  SoftDm* d = new_dm_object(ctx, it->second, handle, true);
  if (!d) {
    errno = ENOMEM;
    return nullptr;
  }
  return &d->dm;
}

// Forgets this ibv_dm without freeing the memory: it stays importable by handle until ibv_free_dm.
SOFTRDMA_EXPORT void ibv_unimport_dm(ibv_dm* dm) { delete to_dm(dm); }
