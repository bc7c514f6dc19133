// Sharing objects between contexts (ibv_import_device(3), ibv_import_pd(3), ibv_import_mr,
// ibv_import_dm): a dup of cmd_fd imported as a second context reaches the first one's PD, MR and
// DM by handle, with the same keys, and traffic through a QP of the imported context uses them.
// Only the public verbs API: these run unchanged on a kernel device that supports import.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "two_process.h"

namespace softrdma::verbs_test {
namespace {

class Import : public RcPair {
 protected:
  ibv_context* imp = nullptr;
  void SetUp() override {
    RcPair::SetUp();
    int fd = dup(dev.ctx->cmd_fd);
    ASSERT_GE(fd, 0);
    imp = ibv_import_device(fd);
    if (!imp && (errno == EOPNOTSUPP || errno == EPROTONOSUPPORT)) {
      close(fd);
      GTEST_SKIP() << "importing a device is not supported";
    }
    ASSERT_NE(imp, nullptr) << strerror(errno);
  }
  void TearDown() override {
    if (imp) {
      EXPECT_EQ(ibv_close_device(imp), 0);
    }
  }
};

TEST_F(Import, DeviceIsTheSame) {
  EXPECT_EQ(imp->device, dev.ctx->device);
  EXPECT_NE(imp, dev.ctx);
  EXPECT_EQ(imp->cmd_fd >= 0, true);
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(imp, &attr), 0);
  EXPECT_EQ(attr.node_guid, dev.attr.node_guid);
}

TEST_F(Import, BadCommandFds) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(p[0]), nullptr) << "a pipe is not a device's command fd";
  EXPECT_NE(errno, 0);
  close(p[0]);
  close(p[1]);
  errno = 0;
  EXPECT_EQ(ibv_import_device(p[0]), nullptr) << "a closed fd";
  EXPECT_NE(errno, 0);
}

TEST_F(Import, PdAndMrByHandle) {
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  Buffer buf(4096);
  ASSERT_TRUE(buf.reg(pd, kAllAccess));

  errno = 0;
  EXPECT_EQ(ibv_import_pd(imp, pd->handle + 1000), nullptr) << "no PD has this handle";
  EXPECT_EQ(errno, ENOENT);
  ibv_pd* ipd = ibv_import_pd(imp, pd->handle);
  ASSERT_NE(ipd, nullptr) << strerror(errno);
  EXPECT_EQ(ipd->handle, pd->handle);
  EXPECT_EQ(ipd->context, imp);

  errno = 0;
  EXPECT_EQ(ibv_import_mr(ipd, buf.mr->handle + 1000), nullptr) << "no MR has this handle";
  EXPECT_EQ(errno, ENOENT);
  ibv_mr* imr = ibv_import_mr(ipd, buf.mr->handle);
  ASSERT_NE(imr, nullptr) << strerror(errno);
  EXPECT_EQ(imr->lkey, buf.mr->lkey);
  EXPECT_EQ(imr->rkey, buf.mr->rkey);
  EXPECT_EQ(imr->length, buf.mr->length);
  EXPECT_EQ(imr->pd, ipd);
  EXPECT_EQ(imr->context, imp);

  // The PD object has the MR in it, whichever struct names it.
  EXPECT_EQ(ibv_dealloc_pd(ipd), EBUSY);
  ibv_unimport_mr(imr);
  ibv_unimport_pd(ipd);
  ASSERT_EQ(ibv_dereg_mr(buf.mr), 0);
  buf.mr = nullptr;
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

TEST_F(Import, DestroyThroughTheImport) {
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  Buffer buf(4096);
  ASSERT_TRUE(buf.reg(pd, kAllAccess));
  ibv_pd* ipd = ibv_import_pd(imp, pd->handle);
  ASSERT_NE(ipd, nullptr);
  ibv_mr* imr = ibv_import_mr(ipd, buf.mr->handle);
  ASSERT_NE(imr, nullptr);
  const uint32_t mr_handle = buf.mr->handle, pd_handle = pd->handle;
  // Deregistering through the import destroys the MR: it can no longer be imported, and the
  // original struct has nothing left to deregister (only unimport remains for it).
  ASSERT_EQ(ibv_dereg_mr(imr), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(ipd, mr_handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_NE(ibv_dereg_mr(buf.mr), 0);
  ibv_unimport_mr(buf.mr);
  buf.mr = nullptr;
  ASSERT_EQ(ibv_dealloc_pd(ipd), 0);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(imp, pd_handle), nullptr);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_NE(ibv_dealloc_pd(pd), 0);
  ibv_unimport_pd(pd);
}

TEST_F(Import, DmByHandle) {
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &ex), 0);
  if (!ex.max_dm_size) GTEST_SKIP() << "no device memory";
  ibv_alloc_dm_attr da{};
  da.length = 4096;
  ibv_dm* dm = ibv_alloc_dm(dev.ctx, &da);
  ASSERT_NE(dm, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(imp, dm->handle + 1000), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ibv_dm* idm = ibv_import_dm(imp, dm->handle);
  ASSERT_NE(idm, nullptr) << strerror(errno);
  EXPECT_EQ(idm->handle, dm->handle);
  std::vector<uint8_t> in(4096), out(4096);
  fill_pattern(in.data(), in.size(), 5);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 0, in.data(), in.size()), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), idm, 0, out.size()), 0);
  EXPECT_EQ(check_pattern(out.data(), out.size(), 5), out.size());
  // An MR on the imported DM keeps the memory from being freed through either struct.
  ibv_pd* ipd = ibv_alloc_pd(imp);
  ASSERT_NE(ipd, nullptr);
  ibv_mr* mr = ibv_reg_dm_mr(ipd, idm, 0, 4096, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_free_dm(dm), EBUSY);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(ipd), 0);
  ibv_unimport_dm(idm);
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

// As rdma-core's test_shared_pd: a QP of the imported context, in the imported PD, posts with the
// imported MR's lkey and is written through its rkey by a QP of the original context.
TEST_F(Import, TrafficThroughImportedObjects) {
  constexpr size_t kLen = 8192;
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  Buffer mem(kLen);
  ASSERT_TRUE(mem.reg(pd, kAllAccess));
  ibv_pd* ipd = ibv_import_pd(imp, pd->handle);
  ASSERT_NE(ipd, nullptr);
  ibv_mr* imr = ibv_import_mr(ipd, mem.mr->handle);
  ASSERT_NE(imr, nullptr);

  ibv_cq* icq = ibv_create_cq(imp, 16, nullptr, nullptr, 0);
  ASSERT_NE(icq, nullptr);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = icq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {16, 16, 1, 1, 0};
  ibv_qp* iqp = ibv_create_qp(ipd, &ia);
  ASSERT_NE(iqp, nullptr) << strerror(errno);

  ASSERT_TRUE(a.create(dev, qcfg));
  const uint32_t ipsn = random_psn();
  ASSERT_EQ(bring_up(iqp, ipsn, a.qpn(), a.psn, dev.gid, conn, dev.attr), 0);
  ASSERT_EQ(bring_up(a.qp, a.psn, iqp->qp_num, ipsn, dev.gid, conn, dev.attr), 0);
  VT_BUF(abuf, a, kLen);

  // a writes into the shared memory through the imported MR's rkey.
  fill_pattern(abuf->data, kLen, 41);
  SendWr w(1, IBV_WR_RDMA_WRITE, {abuf->sge(0, kLen)});
  w.rdma(mem.addr(), imr->rkey);
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(mem.data, kLen, 41), kLen);

  // The imported QP sends it back from the memory, with the imported lkey.
  fill_pattern(mem.data, kLen, 42);
  ASSERT_EQ(post_recv(a.qp, 2, {abuf->sge(0, kLen)}), 0);
  SendWr s(3, IBV_WR_SEND, {ibv_sge{mem.addr(), static_cast<uint32_t>(kLen), imr->lkey}});
  ASSERT_EQ(post_send(iqp, s), 0);
  ASSERT_TRUE(poll_wc(icq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(poll_wc(a.rcq, &wc));
  expect_wc(wc, {.wr_id = 2, .opcode = IBV_WC_RECV, .byte_len = static_cast<uint32_t>(kLen)});
  EXPECT_EQ(check_pattern(abuf->data, kLen, 42), kLen);

  EXPECT_EQ(ibv_destroy_qp(iqp), 0);
  EXPECT_EQ(ibv_destroy_cq(icq), 0);
  ibv_unimport_mr(imr);
  ibv_unimport_pd(ipd);
  ASSERT_EQ(ibv_dereg_mr(mem.mr), 0);
  mem.mr = nullptr;
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// The object space lives while any context on it does: the imported context keeps working after
// the one it was imported from is closed.
TEST(ImportLifetime, ImportedContextOutlivesTheOriginal) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  int fd = dup(dev.ctx->cmd_fd);
  ibv_context* imp = ibv_import_device(fd);
  if (!imp && errno == EOPNOTSUPP) GTEST_SKIP() << "importing a device is not supported";
  ASSERT_NE(imp, nullptr);
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  const uint32_t handle = pd->handle;
  ibv_unimport_pd(pd);  // the struct goes with its context; the PD object stays
  ibv_close_device(dev.ctx);
  dev.ctx = nullptr;
  ibv_pd* ipd = ibv_import_pd(imp, handle);
  ASSERT_NE(ipd, nullptr) << strerror(errno);
  ibv_cq* cq = ibv_create_cq(imp, 4, nullptr, nullptr, 0);
  EXPECT_NE(cq, nullptr);
  if (cq) {
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
  }
  EXPECT_EQ(ibv_dealloc_pd(ipd), 0);
  EXPECT_EQ(ibv_close_device(imp), 0);
}

// Another process gets the command fd over a socket (SCM_RIGHTS). With the kernel it can import the
// context and its PD; softrdma's objects live in the process that opened the device, so there the
// import is refused with EOPNOTSUPP. Either way nothing else happens: no crash, no hang.
int import_in_child(int sock) {
  uint32_t pd_handle = 0;
  char data = 0;
  iovec iov{&data, 1};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof ctl;
  if (recvmsg(sock, &msg, 0) != 1 || !read_full(sock, &pd_handle, sizeof pd_handle)) return 1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) return 2;
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  char verdict = 'u';
  if (ibv_context* ctx = ibv_import_device(fd)) {
    ibv_pd* pd = ibv_import_pd(ctx, pd_handle);
    verdict = pd && pd->handle == pd_handle ? 'k' : 'p';
    if (pd) ibv_unimport_pd(pd);
    ibv_close_device(ctx);
  } else {
    verdict = errno == EOPNOTSUPP ? 'u' : 'e';
    close(fd);
  }
  return write_full(sock, &verdict, 1) ? 0 : 3;
}

TEST(ImportAcrossProcesses, ImportedOrRefusedCleanly) {
  int sock = -1;
  pid_t pid = fork_target(import_in_child, &sock);  // before any device is open here
  ASSERT_GE(pid, 0);
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  char data = 'f';
  iovec iov{&data, 1};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof ctl;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &dev.ctx->cmd_fd, sizeof(int));
  ASSERT_EQ(sendmsg(sock, &msg, 0), 1);
  ASSERT_TRUE(write_full(sock, &pd->handle, sizeof pd->handle));
  char verdict = 0;
  EXPECT_TRUE(read_full(sock, &verdict, 1));
  EXPECT_TRUE(verdict == 'k' || verdict == 'u') << "child: " << verdict;
  int st = 0;
  EXPECT_TRUE(reap_within(pid, kWaitSeconds, &st));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(sock);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

}  // namespace
}  // namespace softrdma::verbs_test
