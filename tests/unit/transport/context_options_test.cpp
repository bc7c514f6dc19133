// A device context's engine options come from the configuration table (transport/engine.h,
// context_options): the engine itself reads no environment.
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "config/config.h"
#include "transport/engine.h"

namespace softrdma::transport {
namespace {

config::Settings parse_of(const std::map<std::string, std::string>& env) {
  return config::parse([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(ContextOptions, FollowTheTable) {
  const EngineOptions plain = context_options(parse_of({}));
  EXPECT_TRUE(plain.direct);
  EXPECT_FALSE(plain.dump_counters);
  EXPECT_EQ(plain.spin_us, EngineOptions{}.spin_us) << "the engine's default is the table's";
  const EngineOptions set = context_options(
      parse_of({{"SOFTRDMA_SPIN_US", "0"}, {"SOFTRDMA_COUNTERS", "1"}, {"SOFTRDMA_DIRECT", "0"}}));
  EXPECT_EQ(set.spin_us, 0u);
  EXPECT_TRUE(set.dump_counters);
  EXPECT_FALSE(set.direct);
}

// Packet faults keep a context off the direct path, as they keep iWARP's connection setup off it.
TEST(ContextOptions, ImpairedContextHasNoDirectPath) {
  const config::Settings s = parse_of({{"SOFTRDMA_IMPAIR", "seed=3,tx_drop=0.01"}});
  EXPECT_FALSE(context_options(s).direct);
  EXPECT_EQ(context_options(s).direct, s.direct) << "the engine and iWARP's CM read one definition";
}

}  // namespace
}  // namespace softrdma::transport
