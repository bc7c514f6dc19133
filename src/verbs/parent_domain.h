// Thread domains and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)).
//
// A parent domain is an ibv_pd that stands for the PD it was made from: it carries that PD's handle,
// so everything created in it has exactly that PD's protection (an MR of the PD serves a QP of the
// parent domain and back). With IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS the objects created in it --
// QPs, SRQs, and CQs given it through ibv_create_cq_ex -- live in memory from the application's
// alloc() callback (the object the application's pointer points to, with its translation state),
// released through free() when they are destroyed; IBV_ALLOCATOR_USE_DEFAULT means the heap. Rings a
// peer process maps (CQ rings, receive queues) stay in the context's shared arena, whatever the
// allocator: the direct path needs them there.
//
// A thread domain is the application's promise of single-threaded use. softrdma keeps its locks
// (correct either way), so a thread domain changes nothing but the reference it holds.
#pragma once
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace softrdma::verbs {

// resource_type passed to alloc()/free(): rdma_driver_id in the upper 32 bits (softrdma has none of
// its own: 0, RDMA_DRIVER_UNKNOWN), the object in the lower.
enum : uint64_t { kResourceQp = 1, kResourceCq = 2, kResourceSrq = 3, kResourceSendQueue = 4 };

// ibv_alloc_td / ibv_dealloc_td / ibv_alloc_parent_domain (verbs_context ops).
ibv_td* alloc_td(ibv_context* ctx, ibv_td_init_attr* attr);
int dealloc_td(ibv_td* td);
ibv_pd* alloc_parent_domain(ibv_context* ctx, ibv_parent_domain_init_attr* attr);
// ibv_dealloc_pd of a parent domain: EBUSY while objects use it.
int dealloc_parent_domain(ibv_pd* pd);
bool is_parent_domain(const ibv_pd* pd);

// Memory for an object created in pd (nullptr: none): from the parent domain's alloc() when it has
// one that does not answer IBV_ALLOCATOR_USE_DEFAULT, else the heap. nullptr when alloc() fails.
void* pd_allocate(ibv_pd* pd, size_t size, size_t alignment, uint64_t resource_type);
// Gives memory from pd_allocate back where it came from.
void pd_release(ibv_pd* pd, void* p, uint64_t resource_type);

template <typename T>
T* pd_new(ibv_pd* pd, uint64_t resource_type) {
  void* p = pd_allocate(pd, sizeof(T), alignof(T) < 64 ? 64 : alignof(T), resource_type);
  return p ? new (p) T{} : nullptr;
}

template <typename T>
void pd_delete(ibv_pd* pd, T* obj, uint64_t resource_type) {
  obj->~T();
  pd_release(pd, obj, resource_type);
}

}  // namespace softrdma::verbs
