// XRC domains (ibv_open_xrcd(3), ibv_close_xrcd) and SRQ numbers (ibv_get_srq_num(3)). A domain opened
// on a file is named by the file's inode, as the kernel's is: every handle of this process on the same
// inode and device shares one domain, and other processes see that it exists through a marker file
// in /dev/shm that each holder keeps a shared flock on (released by the kernel when a holder dies).
// That is what O_CREAT / O_EXCL decide on. XRC SRQs and XRC_RECV QPs of one domain meet only within
// one context: a target QP delivers into the SRQs of its own context.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "transport/srq.h"
#include "verbs/soft_objects.h"

namespace softrdma::verbs {

struct XrcDomain {
  uint32_t id = 0;
  int refs = 0;         // handles (ibv_xrcd) open on it in this process
  int marker_fd = -1;   // holds a shared flock while this process has the domain open; -1: private
  std::string marker;
  std::tuple<int, dev_t, ino_t> key{};
};

namespace {

std::mutex domains_mu;
std::map<std::tuple<int, dev_t, ino_t>, XrcDomain*>& domains() {
  static auto* m = new std::map<std::tuple<int, dev_t, ino_t>, XrcDomain*>;
  return *m;
}
uint32_t next_domain_id = 1;  // under domains_mu

// Another process holds the domain of this marker open (a shared flock we cannot upgrade past).
bool held_elsewhere(int fd) {
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
    flock(fd, LOCK_UN);
    return false;
  }
  return true;
}

}  // namespace

ibv_xrcd* open_xrcd(ibv_context* ctx, ibv_xrcd_init_attr* attr) {
  constexpr uint32_t kKnown = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  if (!attr || (attr->comp_mask & ~kKnown) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) ||
      !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) || (attr->oflags & ~(O_CREAT | O_EXCL))) {
    errno = EINVAL;
    return nullptr;
  }
  auto* x = new (std::nothrow) SoftXrcd{};
  if (!x) {
    errno = ENOMEM;
    return nullptr;
  }
  std::lock_guard lock(domains_mu);
  XrcDomain* d = nullptr;
  if (attr->fd == -1) {
    d = new XrcDomain{};  // a private domain: no inode, nobody else can open it
  } else {
    struct stat st {};
    if (fstat(attr->fd, &st) != 0) {
      delete x;
      errno = EBADF;
      return nullptr;
    }
    const SoftDevice& dev = *to_ctx(ctx)->device;
    auto key = std::make_tuple(dev.index, st.st_dev, st.st_ino);
    auto it = domains().find(key);
    if (it != domains().end()) {
      d = it->second;
      if (attr->oflags & O_EXCL) {
        delete x;
        errno = EINVAL;  // as the kernel answers O_EXCL for an inode that has a domain
        return nullptr;
      }
    } else {
      std::string marker = "/dev/shm/softrdma-xrcd-" + std::string(dev.dev.name) + "-" +
                           std::to_string(static_cast<unsigned long long>(st.st_dev)) + "-" +
                           std::to_string(static_cast<unsigned long long>(st.st_ino));
      int fd = open(marker.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0) {
        delete x;
        return nullptr;  // errno from open
      }
      const bool exists = held_elsewhere(fd);
      int err = 0;
      if (!exists && !(attr->oflags & O_CREAT)) err = EAGAIN;  // no domain yet, and not asked to create
      if (exists && (attr->oflags & O_EXCL)) err = EINVAL;
      if (!err && flock(fd, LOCK_SH) != 0) err = errno;
      if (err) {
        close(fd);
        delete x;
        errno = err;
        return nullptr;
      }
      d = new XrcDomain{};
      d->marker_fd = fd;
      d->marker = std::move(marker);
      d->key = key;
      domains()[key] = d;
    }
  }
  if (!d->id) d->id = next_domain_id++;
  ++d->refs;
  x->domain = d;
  x->id = d->id;
  x->xrcd.context = ctx;
  return &x->xrcd;
}

int close_xrcd(ibv_xrcd* xrcd) {
  SoftXrcd* x = to_xrcd(xrcd);
  if (x->users.load()) return EBUSY;  // XRC SRQs or QPs still use it (ibv_close_xrcd(3))
  {
    std::lock_guard lock(domains_mu);
    XrcDomain* d = x->domain;
    if (--d->refs == 0) {
      if (d->marker_fd >= 0) {
        domains().erase(d->key);
        // The last holder anywhere removes the marker; another holder keeps it.
        if (!held_elsewhere(d->marker_fd)) unlink(d->marker.c_str());
        close(d->marker_fd);
      }
      delete d;
    }
  }
  delete x;
  return 0;
}

int get_srq_num(ibv_srq* srq, uint32_t* srq_num) {
  SoftSrq* s = to_srq(srq);
  // Every SRQ has a number (as mlx5 reports); only an XRC SRQ's is one an XRC target delivers to.
  *srq_num = s->tsrq->srqn;
  return 0;
}

namespace {
std::mutex targets_mu;
std::vector<SoftQp*>& targets() {
  static auto* v = new std::vector<SoftQp*>;
  return *v;
}
}  // namespace

void register_xrc_target(SoftQp* q) {
  std::lock_guard lock(targets_mu);
  targets().push_back(q);
}

bool release_xrc_handle(SoftQp* q, SoftQp** owner) {
  std::lock_guard lock(targets_mu);
  SoftQp* o = q->opened_of ? q->opened_of : q;
  *owner = o;
  if (--o->handles > 0) return false;
  std::erase(targets(), o);
  return true;
}

// ibv_open_qp(3): another handle on an XRC_RECV QP of the domain, found by number. The QP stays in
// the context that created it (its engine receives its packets), so the handle is of that context;
// a QP created by another process cannot be opened here.
ibv_qp* open_qp(ibv_context* ctx, ibv_qp_open_attr* attr) {
  constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  if (!attr || (attr->comp_mask & kNeeded) != kNeeded || (attr->comp_mask & ~(kNeeded | IBV_QP_OPEN_ATTR_CONTEXT)) ||
      attr->qp_type != IBV_QPT_XRC_RECV || !attr->xrcd) {
    errno = EINVAL;
    return nullptr;
  }
  SoftXrcd* x = to_xrcd(attr->xrcd);
  auto* h = new (std::nothrow) SoftQp{};
  if (!h) {
    errno = ENOMEM;
    return nullptr;
  }
  std::lock_guard lock(targets_mu);
  SoftQp* found = nullptr;
  for (SoftQp* t : targets()) {
    const ibv_qp& b = t->qpx.qp_base;
    if (b.qp_num == attr->qp_num && t->xrcd->domain == x->domain &&
        to_ctx(b.context)->device == to_ctx(ctx)->device)
      found = t;
  }
  if (!found) {
    delete h;
    errno = EINVAL;  // no such QP in the domain (ibv_open_qp(3) NOTES)
    return nullptr;
  }
  ++found->handles;
  ++x->users;
  h->tqp = found->tqp;
  h->xrcd = x;
  h->opened_of = found;
  h->init = found->init;
  h->attr = found->attr;
  ibv_qp& b = h->qpx.qp_base;
  b = found->qpx.qp_base;
  b.qp_context = (attr->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? attr->qp_context : nullptr;
  pthread_mutex_init(&b.mutex, nullptr);
  pthread_cond_init(&b.cond, nullptr);
  return &b;
}

}  // namespace softrdma::verbs
