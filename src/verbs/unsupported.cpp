// Exported libibverbs symbols softrdma does not implement, and the pure kernel-struct
// translations. Every consumer is linked BIND_NOW, so each symbol of libibverbs.map must exist
// even if it is never called; these fail cleanly instead (rdma-core's error conventions), so a
// program probing an optional feature sees "not supported" rather than a loader abort.

#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

// Prototypes rdma-core keeps in headers Debian does not ship (marshall.h, driver.h).
extern "C" {
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);
}

namespace softrdma::verbs {
namespace {

// Pointer-returning verbs report failure as NULL with errno set.
template <typename T>
T *fail_null() noexcept {
  errno = EOPNOTSUPP;
  return nullptr;
}

}  // namespace
}  // namespace softrdma::verbs

using softrdma::verbs::fail_null;

#pragma GCC visibility push(default)
extern "C" {

// ---- public verbs (prototypes exactly as <infiniband/verbs.h>) ----

// dma-buf memory is device memory exported by a GPU/accelerator driver; with no DMA engine there
// is nothing such memory could be registered with.
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int) {
  return fail_null<ibv_mr>();
}

// 0 = "placement order not guaranteed": the answer that is always safe, and rdma-core's when the
// provider does not say.
int ibv_query_qp_data_in_order(struct ibv_qp *, enum ibv_wr_opcode, uint32_t) { return 0; }

// Registration hook of pre-rdma-core providers; softrdma loads no providers.
void ibv_register_driver(const char *, void *) {}

// ---- kernel <-> verbs struct translations (used by librdmacm on ucma replies) ----

void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src) {
  std::memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid.raw));
  dst->grh.flow_label = src->grh.flow_label;
  dst->grh.sgid_index = src->grh.sgid_index;
  dst->grh.hop_limit = src->grh.hop_limit;
  dst->grh.traffic_class = src->grh.traffic_class;
  dst->dlid = src->dlid;
  dst->sl = src->sl;
  dst->src_path_bits = src->src_path_bits;
  dst->static_rate = src->static_rate;
  dst->is_global = src->is_global;
  dst->port_num = src->port_num;
}

// qp_state is left alone, as rdma-core does: the caller owns the state it asked the kernel for.
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src) {
  dst->cur_qp_state = static_cast<ibv_qp_state>(src->cur_qp_state);
  dst->path_mtu = static_cast<ibv_mtu>(src->path_mtu);
  dst->path_mig_state = static_cast<ibv_mig_state>(src->path_mig_state);
  dst->qkey = src->qkey;
  dst->rq_psn = src->rq_psn;
  dst->sq_psn = src->sq_psn;
  dst->dest_qp_num = src->dest_qp_num;
  dst->qp_access_flags = static_cast<unsigned int>(src->qp_access_flags);
  dst->cap.max_send_wr = src->max_send_wr;
  dst->cap.max_recv_wr = src->max_recv_wr;
  dst->cap.max_send_sge = src->max_send_sge;
  dst->cap.max_recv_sge = src->max_recv_sge;
  dst->cap.max_inline_data = src->max_inline_data;
  ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
  ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
  dst->pkey_index = src->pkey_index;
  dst->alt_pkey_index = src->alt_pkey_index;
  dst->en_sqd_async_notify = src->en_sqd_async_notify;
  dst->sq_draining = src->sq_draining;
  dst->max_rd_atomic = src->max_rd_atomic;
  dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
  dst->min_rnr_timer = src->min_rnr_timer;
  dst->port_num = src->port_num;
  dst->timeout = src->timeout;
  dst->retry_cnt = src->retry_cnt;
  dst->rnr_retry = src->rnr_retry;
  dst->alt_port_num = src->alt_port_num;
  dst->alt_timeout = src->alt_timeout;
}

// The path record fields keep their wire byte order (LIDs, P_Key, flow label are big-endian in
// both structs), so these are plain field copies; only the widths differ.
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src) {
  std::memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid.raw));
  std::memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid.raw));
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<int>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->reversible = static_cast<int>(src->reversible);
  dst->numb_path = src->numb_path;
  dst->pkey = src->pkey;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->mtu = static_cast<uint8_t>(src->mtu);
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}

void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src) {
  std::memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
  std::memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<uint32_t>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->reversible = static_cast<uint32_t>(src->reversible);
  dst->numb_path = src->numb_path;
  dst->pkey = src->pkey;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->mtu = src->mtu;
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}

// ---- IBVERBS_PRIVATE_34: rdma-core's provider interface ----
// Only kernel providers (libmlx5, libefa, ...) import these, and softrdma ships stubs in their
// place; should a system provider get loaded anyway, its constructor's registration is ignored
// and every command it could issue fails, so it never claims a device. Arguments are unused, so
// the provider-side struct types are not declared here.

// A provider's data symbol: whether destroy may succeed after the device is disassociated.
bool verbs_allow_disassociate_destroy = false;

void verbs_register_driver_34(const void *) {}
void verbs_set_ops(void *, const void *) {}
void verbs_uninit_context(void *) {}
void verbs_init_cq(struct ibv_cq *, struct ibv_context *, struct ibv_comp_channel *, void *) {}
void __verbs_log(void *, uint32_t, const char *, ...) {}

struct ibv_context *verbs_open_device(struct ibv_device *, void *) {
  return fail_null<ibv_context>();
}

void *_verbs_init_and_alloc_context(struct ibv_device *, int, size_t, void *, uint32_t) {
  return fail_null<void>();
}

// Sizes a command buffer: with no linked buffer to add, the count asked for is the answer.
unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void *) { return num_attrs; }

int execute_ioctl(struct ibv_context *, void *) { return EOPNOTSUPP; }

int ibv_read_ibdev_sysfs_file(char *, size_t, void *, const char *, ...) {
  errno = EOPNOTSUPP;
  return -1;
}

// The uverbs write/ioctl commands all return a positive errno on failure.
#define SOFTRDMA_UNSUPPORTED_CMD(name) \
  int name() { return EOPNOTSUPP; }

SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_advise_mr)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_alloc_dm)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_alloc_mw)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_alloc_pd)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_attach_mcast)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_close_xrcd)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_ah)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_counters)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_cq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_cq_ex)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_flow)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_flow_action_esp)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_qp)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_qp_ex)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_qp_ex2)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_rwq_ind_table)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_srq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_srq_ex)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_create_wq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_dealloc_mw)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_dealloc_pd)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_dereg_mr)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_destroy_ah)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_destroy_counters)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_destroy_cq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_destroy_flow)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_destroy_flow_action)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_destroy_qp)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_destroy_rwq_ind_table)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_destroy_srq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_destroy_wq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_detach_mcast)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_free_dm)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_get_context)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_modify_cq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_modify_flow_action_esp)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_modify_qp)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_modify_qp_ex)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_modify_srq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_modify_wq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_open_qp)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_open_xrcd)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_poll_cq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_post_recv)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_post_send)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_post_srq_recv)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_query_context)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_query_device_any)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_query_mr)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_query_port)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_query_qp)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_query_srq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_read_counters)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_reg_dm_mr)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_reg_dmabuf_mr)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_reg_mr)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_req_notify_cq)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_rereg_mr)
SOFTRDMA_UNSUPPORTED_CMD(ibv_cmd_resize_cq)

#undef SOFTRDMA_UNSUPPORTED_CMD

}  // extern "C"
#pragma GCC visibility pop
