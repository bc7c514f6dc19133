// rdmacm_peer: the other process of a tests/rdmacm case (started with fork + exec, so it has a
// connection manager and devices of its own). Plain rdma_cm API only.
//   rdmacm_peer listen-stop IP     binds IP:0, listens, prints the port, then stops itself (SIGSTOP):
//                                  a peer whose CM never answers.
//   rdmacm_peer connect IP PORT    connects an RC QP, prints "up", then waits for stdin to close and
//                                  exits without rdma_disconnect (exit handlers run).
//   rdmacm_peer connect IP PORT wait  the same, but after "up" waits (up to 60 s) for DISCONNECTED and
//                                  prints "disconnected".
//   rdmacm_peer accept IP          binds IP:0, prints the port, accepts one RC connection, prints "up",
//                                  then waits (up to 60 s) for DISCONNECTED and prints "disconnected".
//   rdmacm_peer sends IP PORT N ROUNDS  ROUNDS times: connects an RC QP, waits for the server's SEND,
//                                  posts N SENDs (wr_id and payload i), waits for their completions,
//                                  then rdma_disconnect at once and waits for DISCONNECTED.
// Exit status 0, or 2..9 for the step that failed (stderr says which round and why).
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// One round of "sends": 0, or the step that failed.
int send_round(rdma_event_channel* ch, const char* ip, uint16_t port, int n);

rdma_cm_event* wait_event(rdma_event_channel* ch, rdma_cm_event_type want) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, 20000) != 1) return nullptr;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev)) return nullptr;
  if (ev->event != want) {
    fprintf(stderr, "peer: got %s (status %d), wanted %s\n", rdma_event_str(ev->event), ev->status,
            rdma_event_str(want));
    rdma_ack_cm_event(ev);
    return nullptr;
  }
  return ev;
}

sockaddr_in addr(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return 3;
  if (!strcmp(argv[1], "listen-stop")) {
    sockaddr_in a = addr(argv[2], 0);
    if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)) || rdma_listen(id, 4)) return 4;
    printf("%u\n", ntohs(rdma_get_src_port(id)));
    fflush(stdout);
    raise(SIGSTOP);
    pause();
    return 0;
  }
  if (!strcmp(argv[1], "accept")) {
    sockaddr_in a = addr(argv[2], 0);
    if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)) || rdma_listen(id, 4)) return 4;
    printf("%u\n", ntohs(rdma_get_src_port(id)));
    fflush(stdout);
    rdma_cm_event* ev = wait_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    if (!ev) return 5;
    rdma_cm_id* child = ev->id;
    rdma_ack_cm_event(ev);
    ibv_qp_init_attr qa{};
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(child, nullptr, &qa)) return 6;
    if (rdma_accept(child, nullptr)) return 7;
    if (!(ev = wait_event(ch, RDMA_CM_EVENT_ESTABLISHED))) return 8;
    rdma_ack_cm_event(ev);
    printf("up\n");
    fflush(stdout);
    pollfd p{ch->fd, POLLIN, 0};
    if (poll(&p, 1, 60000) != 1) return 9;
    if (!(ev = wait_event(ch, RDMA_CM_EVENT_DISCONNECTED))) return 9;
    rdma_ack_cm_event(ev);
    printf("disconnected\n");
    fflush(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "sends") && argc == 6) {
    rdma_destroy_id(id);
    const int n = atoi(argv[4]), rounds = atoi(argv[5]);
    for (int r = 0; r < rounds; ++r)
      if (int st = send_round(ch, argv[2], static_cast<uint16_t>(atoi(argv[3])), n)) {
        fprintf(stderr, "peer: round %d failed at step %d\n", r, st);
        return st;
      }
    // Every round's id is gone, so nothing else holds the channel (LeakSanitizer would say so).
    rdma_destroy_event_channel(ch);
    return 0;
  }
  if (!strcmp(argv[1], "connect") && (argc == 4 || argc == 5)) {
    sockaddr_in a = addr(argv[2], static_cast<uint16_t>(atoi(argv[3])));
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), 5000)) return 4;
    rdma_cm_event* ev = wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    if (!ev) return 5;
    rdma_ack_cm_event(ev);
    if (rdma_resolve_route(id, 5000)) return 5;
    if (!(ev = wait_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED))) return 5;
    rdma_ack_cm_event(ev);
    ibv_qp_init_attr qa{};
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(id, nullptr, &qa)) return 6;
    rdma_conn_param cp{};
    cp.retry_count = 7;
    cp.rnr_retry_count = 7;
    if (rdma_connect(id, &cp)) return 7;
    if (!(ev = wait_event(ch, RDMA_CM_EVENT_ESTABLISHED))) return 8;
    rdma_ack_cm_event(ev);
    printf("up\n");
    fflush(stdout);
    if (argc == 5) {
      pollfd p{ch->fd, POLLIN, 0};
      if (poll(&p, 1, 60000) != 1 || !(ev = wait_event(ch, RDMA_CM_EVENT_DISCONNECTED))) return 9;
      rdma_ack_cm_event(ev);
      printf("disconnected\n");
      fflush(stdout);
      return 0;
    }
    char b;
    while (read(0, &b, 1) > 0) {
    }
    exit(0);
  }
  return 9;
}

namespace {

int send_round(rdma_event_channel* ch, const char* ip, uint16_t port, int n) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return 3;
  sockaddr_in a = addr(ip, port);
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), 5000)) return 4;
  rdma_cm_event* ev = wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  if (!ev) return 4;
  rdma_ack_cm_event(ev);
  if (rdma_resolve_route(id, 5000) || !(ev = wait_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED))) return 4;
  rdma_ack_cm_event(ev);
  static uint32_t buf[64];
  ibv_pd* pd = ibv_alloc_pd(id->verbs);
  ibv_cq* cq = pd ? ibv_create_cq(id->verbs, 2 * n + 4, nullptr, nullptr, 0) : nullptr;
  ibv_mr* mr = cq ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  if (!mr) return 5;
  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.send_cq = qa.recv_cq = cq;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = static_cast<uint32_t>(n + 1);
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, pd, &qa)) return 5;
  ibv_sge rs{reinterpret_cast<uint64_t>(&buf[0]), 4, mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  if (ibv_post_recv(id->qp, &rwr, &bad_r)) return 5;
  rdma_conn_param cp{};
  cp.retry_count = 7;
  cp.rnr_retry_count = 7;
  if (rdma_connect(id, &cp) || !(ev = wait_event(ch, RDMA_CM_EVENT_ESTABLISHED))) return 6;
  rdma_ack_cm_event(ev);
  // The server's "go": its receives are posted. Then N SENDs, completed (acknowledged), then at once
  // rdma_disconnect: the server must see every one of them when it learns of the disconnect.
  ibv_wc wc{};
  int got = 0;
  for (int spins = 0; got == 0 && spins < 20000; ++spins)
    if ((got = ibv_poll_cq(cq, 1, &wc)) == 0) usleep(1000);
  if (got != 1 || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) return 7;
  for (int i = 0; i < n; ++i) {
    buf[1 + i] = static_cast<uint32_t>(i);
    ibv_sge s{reinterpret_cast<uint64_t>(&buf[1 + i]), 4, mr->lkey};
    ibv_send_wr swr{};
    swr.wr_id = static_cast<uint64_t>(i);
    swr.sg_list = &s;
    swr.num_sge = 1;
    swr.opcode = IBV_WR_SEND;
    swr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad_s = nullptr;
    if (ibv_post_send(id->qp, &swr, &bad_s)) return 7;
  }
  for (int done = 0, spins = 0; done < n; ++spins) {
    if (spins > 20000) return 8;
    int k = ibv_poll_cq(cq, 1, &wc);
    if (k < 0 || (k == 1 && wc.status != IBV_WC_SUCCESS)) return 8;
    if (k == 1) ++done;
    else usleep(1000);
  }
  if (rdma_disconnect(id) || !(ev = wait_event(ch, RDMA_CM_EVENT_DISCONNECTED))) return 9;
  rdma_ack_cm_event(ev);
  rdma_destroy_qp(id);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  rdma_destroy_id(id);
  return 0;
}

}  // namespace
