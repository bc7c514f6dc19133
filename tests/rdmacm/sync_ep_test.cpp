// Synchronous endpoints (rdma_create_ep without an event channel, rdma_get_request, as rdma-core's
// rdma_server/rdma_client and pyverbs' CMID use them): a request taken from a listener gets a channel
// of its own, and the listener keeps its channel, to take later requests and to be destroyed.
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <gtest/gtest.h>

#include "cm_helpers.h"

#include <string>
#include <thread>

namespace {

using namespace softrdma::cm_test;

rdma_addrinfo* resolve(const char* node, const std::string& port, bool passive) {
  rdma_addrinfo hints{};
  hints.ai_port_space = RDMA_PS_TCP;
  if (passive) hints.ai_flags = RAI_PASSIVE;
  rdma_addrinfo* res = nullptr;
  return rdma_getaddrinfo(node, port.c_str(), &hints, &res) == 0 ? res : nullptr;
}

ibv_qp_init_attr rc_attr() {
  ibv_qp_init_attr a{};
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.qp_type = IBV_QPT_RC;
  a.sq_sig_all = 1;
  return a;
}

// One client connecting synchronously to port; its id, destroyed by the caller.
void client(const std::string& port, rdma_cm_id** out, int* rc) {
  *rc = -1;
  rdma_addrinfo* res = resolve(kIp, port, false);
  if (!res) return;
  ibv_qp_init_attr a = rc_attr();
  if (rdma_create_ep(out, res, nullptr, &a) == 0) *rc = rdma_connect(*out, nullptr);
  rdma_freeaddrinfo(res);
}

TEST(RdmaCmSyncEp, RequestsGetTheirOwnChannelAndTheListenerKeepsItsOwn) {
  // A free port: bind once to learn one, then listen there.
  rdma_addrinfo* res = resolve(kIp, "0", true);
  ASSERT_NE(res, nullptr);
  rdma_cm_id* listen_id = nullptr;
  ibv_qp_init_attr a = rc_attr();
  ASSERT_EQ(rdma_create_ep(&listen_id, res, nullptr, &a), 0);
  rdma_freeaddrinfo(res);
  ASSERT_EQ(rdma_listen(listen_id, 4), 0);
  const std::string port = std::to_string(ntohs(rdma_get_src_port(listen_id)));
  rdma_event_channel* listen_ch = listen_id->channel;
  ASSERT_NE(listen_ch, nullptr);

  // Two requests in turn, the first one destroyed before the second comes: the listener's channel
  // must outlive both (it was released with the first request's migration, then used after free).
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("request " + std::to_string(round));
    rdma_cm_id* cid = nullptr;
    int crc = -1;
    std::thread t(client, port, &cid, &crc);
    rdma_cm_id* child = nullptr;
    ASSERT_EQ(rdma_get_request(listen_id, &child), 0);
    ASSERT_NE(child, nullptr);
    EXPECT_NE(child->channel, nullptr);
    EXPECT_NE(child->channel, listen_ch) << "a request taken synchronously has a channel of its own";
    EXPECT_EQ(listen_id->channel, listen_ch);
    ASSERT_NE(child->qp, nullptr) << "rdma_get_request makes the QP of the listener's endpoint attributes";
    EXPECT_EQ(rdma_accept(child, nullptr), 0);
    t.join();
    ASSERT_EQ(crc, 0);
    ASSERT_NE(cid, nullptr);
    rdma_disconnect(cid);
    rdma_disconnect(child);
    rdma_destroy_ep(child);
    rdma_destroy_ep(cid);
  }
  rdma_destroy_ep(listen_id);
}

}  // namespace
