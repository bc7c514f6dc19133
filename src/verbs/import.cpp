// Sharing a context's objects (ibv_import_device(3), ibv_import_pd(3), ibv_import_mr, ibv_import_dm
// in dm.cpp). With the kernel, a context is its uverbs file: a dup of cmd_fd imported as a new
// ibv_context reaches the same objects by handle. Here cmd_fd is a memfd whose inode this process's
// registry maps to the context's ContextShared (engine and handle tables), so importing works within
// the process that opened the device. A cmd_fd passed to another process (or inherited by a forked
// child) names nothing there: its import is refused with EOPNOTSUPP, since the engine and its
// objects live in the opener's process.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {
constexpr const char* kCmdFdName = "softrdma-context";

using InodeKey = std::pair<uint64_t, uint64_t>;
struct Registry {
  std::mutex mu;
  std::map<InodeKey, std::weak_ptr<ContextShared>> by_inode;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: contexts may be closed from atexit handlers
  return *r;
}

// Whether fd is a softrdma command fd (of any process): its memfd name says so.
bool is_command_fd(int fd) {
  char path[64], target[256];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = 0;
  return strstr(target, kCmdFdName) != nullptr;
}
// Gives back one handle on a shared object: an imported copy is freed at once; the original is only
// marked released. The object goes once it is destroyed, released and no import refers to it.
template <typename T>
void release_handle(T* self, T* o, ContextShared& sh) {
  std::lock_guard lock(sh.mu);
  if (self != o) {
    --o->imports;
    delete self;
  } else {
    o->released = true;
  }
  if (o->destroyed && o->released && o->imports == 0) delete o;
}

}  // namespace

namespace softrdma::verbs {

ContextShared::~ContextShared() {
  if (!fd_ino) return;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.by_inode.find({fd_dev, fd_ino});
  if (it != r.by_inode.end() && it->second.expired()) r.by_inode.erase(it);
}

int open_command_fd(const std::shared_ptr<ContextShared>& shared) {
  int fd = memfd_create(kCmdFdName, MFD_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  shared->fd_dev = st.st_dev;
  shared->fd_ino = st.st_ino;
  shared->owner_pid = getpid();
  Registry& r = registry();
  try {
    std::lock_guard lock(r.mu);
    r.by_inode[{st.st_dev, st.st_ino}] = shared;
  } catch (const std::bad_alloc&) {
    close(fd);
    errno = ENOMEM;
    return -1;
  }
  return fd;
}

}  // namespace softrdma::verbs

// Takes ownership of cmd_fd: ibv_close_device of the new context closes it.
SOFTRDMA_EXPORT ibv_context* ibv_import_device(int cmd_fd) {
  struct stat st{};
  if (fstat(cmd_fd, &st) != 0) {
    errno = EBADF;
    return nullptr;
  }
  std::shared_ptr<ContextShared> shared;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.by_inode.find({st.st_dev, st.st_ino});
    if (it != r.by_inode.end()) shared = it->second.lock();
  }
  // A forked child has a copy of the table, but not the engine's threads.
  if (shared && shared->owner_pid != getpid()) shared.reset();
  if (!shared) {
    errno = is_command_fd(cmd_fd) ? EOPNOTSUPP : EINVAL;
    return nullptr;
  }
  return make_context(std::move(shared), cmd_fd);
}

SOFTRDMA_EXPORT ibv_pd* ibv_import_pd(ibv_context* ctx, uint32_t handle) {
  ContextShared& sh = *to_ctx(ctx)->shared;
  std::lock_guard lock(sh.mu);
  auto it = sh.pds_by_handle.find(handle);
  if (it == sh.pds_by_handle.end()) {
    errno = ENOENT;
    return nullptr;
  }
  auto* p = new (std::nothrow) SoftPd{};
  if (!p) {
    errno = ENOMEM;
    return nullptr;
  }
  p->pd.context = ctx;
  p->pd.handle = handle;
  p->origin = it->second;
  ++p->origin->imports;
  return &p->pd;
}

// Gives a PD struct back without destroying the object (ibv_import_pd(3)). The original's memory
// stays while the object lives (its handle table points there) or imports refer to it.
SOFTRDMA_EXPORT void ibv_unimport_pd(ibv_pd* pd) {
  if (!pd) return;
  release_handle(reinterpret_cast<SoftPd*>(pd), to_pd(pd), *to_ctx(pd->context)->shared);
}

// The MR by handle, with its keys; the PD it is given is the ibv_mr's pd (the object keeps its own).
SOFTRDMA_EXPORT ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t handle) {
  ContextShared& sh = *to_ctx(pd->context)->shared;
  std::lock_guard lock(sh.mu);
  auto it = sh.mrs_by_handle.find(handle);
  if (it == sh.mrs_by_handle.end()) {
    errno = ENOENT;
    return nullptr;
  }
  SoftMr* o = it->second;
  auto* m = new (std::nothrow) SoftMr{};
  if (!m) {
    errno = ENOMEM;
    return nullptr;
  }
  m->mr = o->mr;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->region = o->region;
  m->origin = o;
  ++o->imports;
  return &m->mr;
}

// Gives an MR struct back without deregistering the region, as ibv_unimport_pd does for PDs.
SOFTRDMA_EXPORT void ibv_unimport_mr(ibv_mr* mr) {
  if (!mr) return;
  auto* self = reinterpret_cast<SoftMr*>(mr);
  release_handle(self, self->origin ? self->origin : self, *to_ctx(mr->context)->shared);
}
