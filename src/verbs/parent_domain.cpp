// Thread domains and parent domains: see parent_domain.h for what they are here.
#include "verbs/parent_domain.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "verbs/soft_objects.h"

namespace softrdma::verbs {

namespace {

struct SoftTd {
  ibv_td td;  // first: applications hold &td
  std::atomic<int> users{0};  // parent domains made with it: dealloc is refused while any remain
};

struct SoftParentDomain {
  SoftPd pd;  // first: applications hold &pd.pd; pd.parent_domain is true
  SoftPd* base = nullptr;
  SoftTd* td = nullptr;
  void* (*alloc)(ibv_pd*, void*, size_t, size_t, uint64_t) = nullptr;
  void (*free)(ibv_pd*, void*, void*, uint64_t) = nullptr;
  void* pd_context = nullptr;
  // What alloc() gave, so that exactly that goes back through free() (the rest is the heap's).
  std::mutex mu;
  std::unordered_set<void*> from_alloc;
};

SoftParentDomain* as_parent(ibv_pd* pd) {
  return pd && to_pd(pd)->parent_domain ? reinterpret_cast<SoftParentDomain*>(pd) : nullptr;
}

}  // namespace

bool is_parent_domain(const ibv_pd* pd) { return pd && reinterpret_cast<const SoftPd*>(pd)->parent_domain; }

ibv_td* alloc_td(ibv_context* ctx, ibv_td_init_attr* attr) {
  if (attr && attr->comp_mask) {
    errno = EINVAL;
    return nullptr;
  }
  auto* t = new (std::nothrow) SoftTd{};
  if (!t) {
    errno = ENOMEM;
    return nullptr;
  }
  t->td.context = ctx;
  return &t->td;
}

int dealloc_td(ibv_td* td) {
  auto* t = reinterpret_cast<SoftTd*>(td);
  if (t->users.load()) return EBUSY;
  delete t;
  return 0;
}

ibv_pd* alloc_parent_domain(ibv_context* ctx, ibv_parent_domain_init_attr* attr) {
  constexpr uint32_t known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  // A parent domain extends a protection domain of this context, not another parent domain.
  if (!attr || (attr->comp_mask & ~known) || !attr->pd || attr->pd->context != ctx || is_parent_domain(attr->pd) ||
      (attr->td && attr->td->context != ctx) ||
      ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) && (!attr->alloc || !attr->free))) {
    errno = EINVAL;
    return nullptr;
  }
  auto* p = new (std::nothrow) SoftParentDomain{};
  if (!p) {
    errno = ENOMEM;
    return nullptr;
  }
  p->pd.parent_domain = true;
  p->pd.pd.context = ctx;
  p->pd.pd.handle = attr->pd->handle;  // the same protection domain, to every check
  p->base = to_pd(attr->pd);
  ++p->base->users;
  if (attr->td) {
    p->td = reinterpret_cast<SoftTd*>(attr->td);
    ++p->td->users;
  }
  if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
    p->alloc = attr->alloc;
    p->free = attr->free;
  }
  if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT) p->pd_context = attr->pd_context;
  return &p->pd.pd;
}

int dealloc_parent_domain(ibv_pd* pd) {
  SoftParentDomain* p = as_parent(pd);
  if (p->pd.users.load()) return EBUSY;
  --p->base->users;
  if (p->td) --p->td->users;
  delete p;
  return 0;
}

void* pd_allocate(ibv_pd* pd, size_t size, size_t alignment, uint64_t resource_type) {
  if (SoftParentDomain* p = as_parent(pd); p && p->alloc) {
    void* m = p->alloc(pd, p->pd_context, size, alignment, resource_type);
    if (m != IBV_ALLOCATOR_USE_DEFAULT) {
      // The callback zeroes what it gives (ibv_alloc_parent_domain(3)); a misaligned buffer is refused.
      if (!m || reinterpret_cast<uintptr_t>(m) % alignment != 0) {
        if (m) p->free(pd, p->pd_context, m, resource_type);
        errno = ENOMEM;
        return nullptr;
      }
      try {
        std::lock_guard lock(p->mu);
        p->from_alloc.insert(m);
      } catch (const std::bad_alloc&) {
        p->free(pd, p->pd_context, m, resource_type);
        errno = ENOMEM;
        return nullptr;
      }
      return m;
    }
  }
  void* m = nullptr;
  if (posix_memalign(&m, alignment, size) != 0) {
    errno = ENOMEM;
    return nullptr;
  }
  return m;
}

void pd_release(ibv_pd* pd, void* m, uint64_t resource_type) {
  if (SoftParentDomain* p = as_parent(pd)) {
    bool mine = false;
    {
      std::lock_guard lock(p->mu);
      mine = p->from_alloc.erase(m) != 0;
    }
    if (mine) {
      p->free(pd, p->pd_context, m, resource_type);
      return;
    }
  }
  std::free(m);
}

}  // namespace softrdma::verbs
