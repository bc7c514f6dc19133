// A small, known verbs program for the capture test (capture_test.sh): two RC QPs of one process on
// the device named in argv[1], joined over its GID 0 with path MTU 1024 and chosen PSNs. QP a RDMA
// WRITEs kWriteLen bytes of a known pattern into b's buffer (3 packets: FIRST, MIDDLE, LAST), then
// SENDs kSendText (one SEND ONLY). It checks what arrived, then prints what it sent, for the test to
// find in the capture:
//   a_qpn=0x.. b_qpn=0x.. a_psn=0x.. write_len=N send_text=...
// Pattern byte i: (i * 7 + 3) & 0xff. Exit status 0 when both operations completed and the data is right.
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr uint32_t kPsnA = 0x123456, kPsnB = 0xabcdef;
constexpr size_t kWriteLen = 3000;
constexpr char kSendText[] = "softrdma-capture";

int fail(const char* what) {
  std::fprintf(stderr, "capture_writer: %s\n", what);
  return 1;
}

bool to_rts(ibv_qp* qp, uint32_t my_psn, uint32_t dest_qpn, uint32_t dest_psn, const ibv_gid& gid) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return false;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = dest_psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return false;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = my_psn;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_MAX_QP_RD_ATOMIC) == 0;
}

bool wait_one(ibv_cq* cq, ibv_wc_opcode want) {
  ibv_wc wc{};
  for (long spins = 0; spins < 2'000'000'000L; ++spins) {
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) return false;
    if (n == 1) return wc.status == IBV_WC_SUCCESS && wc.opcode == want;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: capture_writer DEVICE");
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_device* dev = nullptr;
  for (int i = 0; list && i < n; ++i)
    if (std::strcmp(ibv_get_device_name(list[i]), argv[1]) == 0) dev = list[i];
  if (!dev) return fail("no such device");
  ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) return fail("ibv_open_device");
  ibv_gid gid{};
  if (ibv_query_gid(ctx, 1, 0, &gid)) return fail("ibv_query_gid");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq_a = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ibv_cq* cq_b = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  if (!pd || !cq_a || !cq_b) return fail("pd/cq");
  ibv_qp_init_attr init{};
  init.qp_type = IBV_QPT_RC;
  init.cap = {8, 8, 1, 1, 0};
  init.send_cq = init.recv_cq = cq_a;
  ibv_qp* a = ibv_create_qp(pd, &init);
  init.send_cq = init.recv_cq = cq_b;
  ibv_qp* b = ibv_create_qp(pd, &init);
  if (!a || !b) return fail("ibv_create_qp");

  std::vector<uint8_t> src(kWriteLen + sizeof kSendText), dst(kWriteLen), recv(64);
  for (size_t i = 0; i < kWriteLen; ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  std::memcpy(src.data() + kWriteLen, kSendText, sizeof kSendText - 1);
  ibv_mr* src_mr = ibv_reg_mr(pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = ibv_reg_mr(pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_mr* recv_mr = ibv_reg_mr(pd, recv.data(), recv.size(), IBV_ACCESS_LOCAL_WRITE);
  if (!src_mr || !dst_mr || !recv_mr) return fail("ibv_reg_mr");
  if (!to_rts(a, kPsnA, b->qp_num, kPsnB, gid) || !to_rts(b, kPsnB, a->qp_num, kPsnA, gid)) return fail("modify_qp");

  ibv_sge rsge{reinterpret_cast<uintptr_t>(recv.data()), static_cast<uint32_t>(recv.size()), recv_mr->lkey};
  ibv_recv_wr rwr{}, *bad_r = nullptr;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  if (ibv_post_recv(b, &rwr, &bad_r)) return fail("ibv_post_recv");

  ibv_sge wsge{reinterpret_cast<uintptr_t>(src.data()), static_cast<uint32_t>(kWriteLen), src_mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &wsge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
  wr.wr.rdma.rkey = dst_mr->rkey;
  if (ibv_post_send(a, &wr, &bad) || !wait_one(cq_a, IBV_WC_RDMA_WRITE)) return fail("RDMA WRITE");
  if (std::memcmp(src.data(), dst.data(), kWriteLen) != 0) return fail("the WRITE's data differs");

  ibv_sge ssge{reinterpret_cast<uintptr_t>(src.data() + kWriteLen), static_cast<uint32_t>(sizeof kSendText - 1),
               src_mr->lkey};
  wr = {};
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &ssge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(a, &wr, &bad) || !wait_one(cq_a, IBV_WC_SEND) || !wait_one(cq_b, IBV_WC_RECV))
    return fail("SEND");
  if (std::memcmp(recv.data(), kSendText, sizeof kSendText - 1) != 0) return fail("the SEND's data differs");

  std::printf("a_qpn=0x%x b_qpn=0x%x a_psn=0x%x write_len=%zu send_text=%s\n", a->qp_num, b->qp_num, kPsnA,
              kWriteLen, kSendText);
  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_dereg_mr(src_mr);
  ibv_dereg_mr(dst_mr);
  ibv_dereg_mr(recv_mr);
  ibv_destroy_cq(cq_a);
  ibv_destroy_cq(cq_b);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
