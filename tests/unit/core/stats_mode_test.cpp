// Modes of the shared-memory stats pages (core/stats.h): owner only unless SOFTRDMA_STATS_MODE
// widens them, never writable by others, never created through a planted file or symlink.
#include "core/stats.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

namespace softrdma::core {
namespace {

// The mode of a page created with SOFTRDMA_STATS_MODE=env (nullptr: unset).
mode_t page_mode(const char* env) {
  const config::Settings s = config::parse([env](const char* name) -> const char* {
    return std::string_view(name) == "SOFTRDMA_STATS_MODE" ? env : nullptr;
  });
  StatsPage page("mode-test", s);
  struct stat st{};
  if (page.path().empty() || stat(page.path().c_str(), &st) != 0) return 07777;
  return st.st_mode & 07777;
}

TEST(StatsMode, OwnerOnlyByDefaultAndWidenedOnlyToReading) {
  EXPECT_EQ(page_mode(nullptr), 0600u);
  EXPECT_EQ(page_mode(""), 0600u);
  EXPECT_EQ(page_mode("0640"), 0640u);
  EXPECT_EQ(page_mode("644"), 0644u);
  EXPECT_EQ(page_mode("0666"), 0644u);   // no write bit for others, ever
  EXPECT_EQ(page_mode("0777"), 0644u);   // nor execute bits
  EXPECT_EQ(page_mode("0400"), 0600u);   // the owner keeps writing its own page
  EXPECT_EQ(page_mode("rw-r--r--"), 0600u);  // not octal: the default
  EXPECT_EQ(page_mode("01777"), 0600u);
}

TEST(StatsMode, UmaskDoesNotNarrowAWidenedMode) {
  mode_t old = umask(077);
  EXPECT_EQ(page_mode("0644"), 0644u);
  umask(old);
}

// A file left under a page's future name by someone else is not written through; a symlink there
// is not followed. (The next page's name is predictable: pid and a per-process serial.)
TEST(StatsMode, PlantedSymlinkIsNotFollowed) {
  const std::string target = "/dev/shm/softrdma-unit-stats-target-" + std::to_string(getpid());
  int fd = open(target.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  std::string next;
  {
    StatsPage probe("probe");
    next = probe.path();
  }
  // The page after "probe" takes the next serial.
  std::string base = next.substr(0, next.rfind('-') + 1);
  uint32_t serial = static_cast<uint32_t>(std::stoul(next.substr(next.rfind('-') + 1)));
  const std::string planted = base + std::to_string(serial + 1);
  ASSERT_EQ(symlink(target.c_str(), planted.c_str()), 0);
  {
    StatsPage page("after-symlink");
    // Our own leftover symlink is not a regular file: left alone, and counting stays private.
    EXPECT_TRUE(page.path().empty());
    page.device().tx_packets = 1;  // still counts
  }
  struct stat st{};
  ASSERT_EQ(stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the page was written through a planted symlink";
  unlink(planted.c_str());
  unlink(target.c_str());
}

}  // namespace
}  // namespace softrdma::core
