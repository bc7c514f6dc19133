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
// Exit status 0, or 2..9 for the step that failed.
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

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
