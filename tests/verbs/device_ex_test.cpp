// ibv_query_device_ex: agrees with ibv_query_device, honours a caller's shorter struct, and every
// capability it reports absent is refused by the verb that would use it (and present ones work).
#include <cstring>
#include <vector>

#include "helpers.h"

namespace softrdma::verbs_test {
namespace {

class DeviceEx : public ::testing::Test {
 protected:
  Device dev;
  ibv_device_attr_ex ex{};
  void SetUp() override {
    ASSERT_TRUE(dev.ok()) << "no device with GID[0] = ::ffff:127.0.0.1 on port 1";
    ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &ex), 0);
  }
};

TEST_F(DeviceEx, AgreesWithQueryDevice) {
  ibv_device_attr classic{};
  ASSERT_EQ(ibv_query_device(dev.ctx, &classic), 0);
  EXPECT_EQ(std::memcmp(&ex.orig_attr, &classic, sizeof classic), 0) << "orig_attr differs from ibv_query_device";
  // The extended flags carry the classic ones in their low 32 bits.
  EXPECT_EQ(ex.device_cap_flags_ex & 0xffffffffull, uint64_t{classic.device_cap_flags});
  if (ex.phys_port_cnt_ex) {
    EXPECT_EQ(ex.phys_port_cnt_ex, uint32_t{classic.phys_port_cnt});
  }
  // A timestamp mask means nothing without the clock's frequency, and the other way round.
  EXPECT_EQ(ex.completion_timestamp_mask != 0, ex.hca_core_clock != 0);
  ibv_query_device_ex_input in{};
  in.comp_mask = 1;
  EXPECT_EQ(ibv_query_device_ex(dev.ctx, &in, &ex), EINVAL) << "unknown input comp_mask";
}

// A program built against an older verbs.h hands the provider a shorter ibv_device_attr_ex: it gets the
// fields it knows, and nothing past its struct is written.
TEST_F(DeviceEx, ShorterCallerStruct) {
  verbs_context* v = verbs_get_ctx_op(dev.ctx, query_device_ex);
  if (!v) GTEST_SKIP() << "provider has no query_device_ex";
  constexpr uint8_t kSentinel = 0xa5;
  for (size_t size : {sizeof(ibv_device_attr), offsetof(ibv_device_attr_ex, odp_caps),
                      offsetof(ibv_device_attr_ex, max_dm_size), offsetof(ibv_device_attr_ex, xrc_odp_caps),
                      sizeof(ibv_device_attr_ex)}) {
    SCOPED_TRACE(size);
    std::vector<uint8_t> buf(sizeof(ibv_device_attr_ex) + 64, kSentinel);
    ASSERT_EQ(v->query_device_ex(dev.ctx, nullptr, reinterpret_cast<ibv_device_attr_ex*>(buf.data()), size), 0);
    for (size_t i = size; i < buf.size(); ++i) ASSERT_EQ(buf[i], kSentinel) << "byte " << i << " written";
    EXPECT_EQ(std::memcmp(buf.data(), &ex, size), 0) << "fields differ from the full query";
  }
  std::vector<uint8_t> tiny(sizeof(ibv_device_attr), kSentinel);
  EXPECT_EQ(v->query_device_ex(dev.ctx, nullptr, reinterpret_cast<ibv_device_attr_ex*>(tiny.data()), 16), EINVAL);
  for (uint8_t b : tiny) ASSERT_EQ(b, kSentinel);
}

TEST_F(DeviceEx, TimestampClockQueriesWhenReported) {
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  if (!ex.hca_core_clock) {
    // No clock: creating a timestamping CQ must fail.
    ibv_cq_init_attr_ex a{};
    a.cqe = 4;
    a.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
    EXPECT_EQ(ibv_create_cq_ex(dev.ctx, &a), nullptr);
    return;
  }
  ASSERT_EQ(ibv_query_rt_values_ex(dev.ctx, &v), 0);
  ASSERT_TRUE(v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK);
  auto ticks = [](const ibv_values_ex& x) {
    return static_cast<uint64_t>(x.raw_clock.tv_sec) * 1000000000ull + static_cast<uint64_t>(x.raw_clock.tv_nsec);
  };
  uint64_t t0 = ticks(v);
  EXPECT_NE(t0 & ex.completion_timestamp_mask, 0u);
  ibv_values_ex w{};
  w.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  ASSERT_EQ(ibv_query_rt_values_ex(dev.ctx, &w), 0);
  EXPECT_GE(ticks(w), t0) << "raw clock went backwards";
  ibv_cq_init_attr_ex a{};
  a.cqe = 4;
  a.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  ibv_cq_ex* cq = ibv_create_cq_ex(dev.ctx, &a);
  ASSERT_NE(cq, nullptr) << "timestamps reported but a timestamping CQ is refused: " << strerror(errno);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

// Capabilities reported as absent are refused by the verbs that would need them.
TEST_F(DeviceEx, AbsentCapabilitiesRefused) {
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  std::vector<uint8_t> mem(8192);
  if (!(ex.odp_caps.general_caps & IBV_ODP_SUPPORT)) {
    ibv_mr* mr = ibv_reg_mr(pd, mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
    EXPECT_EQ(mr, nullptr) << "on-demand paging MR without IBV_ODP_SUPPORT";
    if (mr) ibv_dereg_mr(mr);
  }
  if (!ex.max_dm_size) {
    ibv_alloc_dm_attr da{};
    da.length = 64;
    ibv_dm* dm = ibv_alloc_dm(dev.ctx, &da);
    EXPECT_EQ(dm, nullptr) << "device memory without max_dm_size";
    if (dm) ibv_free_dm(dm);
  }
  ibv_cq* cq = ibv_create_cq(dev.ctx, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  if (!ex.cq_mod_caps.max_cq_count) {
    ibv_modify_cq_attr ma{};
    ma.attr_mask = IBV_CQ_ATTR_MODERATE;
    ma.moderate.cq_count = 4;
    ma.moderate.cq_period = 10;
    EXPECT_NE(ibv_modify_cq(cq, &ma), 0) << "CQ moderation without cq_mod_caps";
  }
  if (!ex.max_wq_type_rq) {
    ibv_wq_init_attr wa{};
    wa.wq_type = IBV_WQT_RQ;
    wa.max_wr = 4;
    wa.max_sge = 1;
    wa.pd = pd;
    wa.cq = cq;
    ibv_wq* wq = ibv_create_wq(dev.ctx, &wa);
    EXPECT_EQ(wq, nullptr) << "receive WQ without max_wq_type_rq";
    if (wq) ibv_destroy_wq(wq);
  }
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

}  // namespace
}  // namespace softrdma::verbs_test
