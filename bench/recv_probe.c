// How a spinning receiver should learn of a datagram on this machine: a UDP ping-pong between two
// processes (server on one CPU, client on another) whose receivers spin on
//   spin: recv(MSG_DONTWAIT), one system call per empty poll (what softrdma's passes do);
//   ipi:  an io_uring multishot recvmsg into a provided-buffer ring, spinning on the completion ring
//         in memory (no system call per poll; the kernel interrupts the spinner to post each CQE);
//   flag: the same with IORING_SETUP_COOP_TASKRUN | TASKRUN_FLAG (no interrupt: an empty poll reads
//         the ring's flags, and one io_uring_enter runs the receive when the kernel flags it).
// It prints the one-way p50/p90 and the polls per message. docs/performance.md has the results.
//   cc -O2 -o recv_probe bench/recv_probe.c -luring          (liburing-dev)
//   ./recv_probe MODE server 127.0.0.1 127.0.0.1 0 & ./recv_probe MODE client 127.0.0.1 127.0.0.1 1
#define _GNU_SOURCE
#include <liburing.h>
#include <arpa/inet.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>

enum { SPIN, URING_IPI, URING_FLAG };
static int mode;
static int iters = 20000;

struct rx {
  int fd;
  struct io_uring ring;
  struct io_uring_buf_ring *br;
  char *bufs;
  struct msghdr mh;
};
#define NBUF 64
#define BUFSZ 2048

static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); sched_setaffinity(0, sizeof s, &s); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }

static void arm(struct rx *r) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
  memset(&r->mh, 0, sizeof r->mh);
  r->mh.msg_namelen = sizeof(struct sockaddr_in);
  io_uring_prep_recvmsg_multishot(sqe, r->fd, &r->mh, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = 1;
  io_uring_submit(&r->ring);
}

static void rx_init(struct rx *r, int fd) {
  r->fd = fd;
  if (mode == SPIN) return;
  struct io_uring_params p; memset(&p, 0, sizeof p);
  if (mode == URING_FLAG) p.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG | IORING_SETUP_SINGLE_ISSUER;
  int rc = io_uring_queue_init_params(64, &r->ring, &p);
  if (rc) { fprintf(stderr, "queue_init %s\n", strerror(-rc)); exit(1); }
  if (posix_memalign((void **)&r->br, 4096, NBUF * sizeof(struct io_uring_buf))) exit(1);
  io_uring_buf_ring_init(r->br);
  struct io_uring_buf_reg reg = { .ring_addr = (unsigned long)r->br, .ring_entries = NBUF, .bgid = 1 };
  rc = io_uring_register_buf_ring(&r->ring, &reg, 0);
  if (rc) { fprintf(stderr, "buf_ring %s\n", strerror(-rc)); exit(1); }
  r->bufs = malloc(NBUF * BUFSZ);
  for (int i = 0; i < NBUF; i++) io_uring_buf_ring_add(r->br, r->bufs + i * BUFSZ, BUFSZ, i, io_uring_buf_ring_mask(NBUF), i);
  io_uring_buf_ring_advance(r->br, NBUF);
  arm(r);
}

static long polls;
// Waits for one datagram; returns its payload length.
static int rx_one(struct rx *r, char *out) {
  if (mode == SPIN) {
    for (;;) { polls++; int n = recv(r->fd, out, BUFSZ, MSG_DONTWAIT); if (n >= 0) return n; }
  }
  for (;;) {
    struct io_uring_cqe *cqe;
    polls++;
    if (io_uring_peek_cqe(&r->ring, &cqe) != 0) continue;
    int res = cqe->res; unsigned f = cqe->flags;
    if (res < 0) { fprintf(stderr, "cqe %s\n", strerror(-res)); exit(1); }
    int bid = f >> IORING_CQE_BUFFER_SHIFT;
    char *b = r->bufs + bid * BUFSZ;
    struct io_uring_recvmsg_out *o = io_uring_recvmsg_validate(b, res, &r->mh);
    int n = o ? (int)io_uring_recvmsg_payload_length(o, res, &r->mh) : -1;
    if (n > 0) memcpy(out, io_uring_recvmsg_payload(o, &r->mh), n);
    io_uring_buf_ring_add(r->br, b, BUFSZ, bid, io_uring_buf_ring_mask(NBUF), 0);
    io_uring_buf_ring_advance(r->br, 1);
    io_uring_cqe_seen(&r->ring, cqe);
    if (!(f & IORING_CQE_F_MORE)) arm(r);
    return n;
  }
}

static int mk(const char *ip, int port) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
  inet_pton(AF_INET, ip, &a.sin_addr);
  if (bind(fd, (void *)&a, sizeof a)) { perror("bind"); exit(1); }
  return fd;
}
static void conn(int fd, const char *ip, int port) {
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
  inet_pton(AF_INET, ip, &a.sin_addr);
  connect(fd, (void *)&a, sizeof a);
}

static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: recv_probe spin|ipi|flag server|client MY_IP PEER_IP [CPU [ITERATIONS]]\n");
    return 2;
  }
  mode = !strcmp(argv[1], "spin") ? SPIN : !strcmp(argv[1], "ipi") ? URING_IPI : URING_FLAG;
  int server = !strcmp(argv[2], "server");
  if (argc > 5) pin(atoi(argv[5]));
  if (argc > 6) iters = atoi(argv[6]);
  int fd = mk(argv[3], server ? 7001 : 7002);
  conn(fd, argv[4], server ? 7002 : 7001);
  struct rx r; rx_init(&r, fd);
  char buf[BUFSZ] = "hello";
  double *lat = malloc(sizeof(double) * iters);
  if (server) {
    for (int i = 0; i < iters + 100; i++) { int n = rx_one(&r, buf); send(fd, buf, n, 0); }
    return 0;
  }
  usleep(200000);
  for (int i = 0; i < 100; i++) { send(fd, buf, 14, 0); rx_one(&r, buf); }
  polls = 0;
  for (int i = 0; i < iters; i++) { double t = now(); send(fd, buf, 14, 0); rx_one(&r, buf); lat[i] = (now() - t) / 2; }
  qsort(lat, iters, sizeof(double), cmp);
  printf("%s p50 %.2f us p90 %.2f us polls/msg %.1f\n", argv[1], lat[iters / 2], lat[iters * 9 / 10], (double)polls / iters);
  return 0;
}
