// Hostile local files: /dev/shm is writable by every local user, so what softrdma reads from there
// must survive files it did not write.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "hostile.h"

namespace softrdma::hostile_test {
namespace {

// A stats file named for a live process but shorter than a page (a process of an older build with
// fewer counters, or anyone's file under that name): `softrdma stat` and read_all() must skip it.
TEST(HostileLocal, ShortStatsFileOfLiveProcess) {
  const std::string path = "/dev/shm/softrdma-stats-" + std::to_string(getpid()) + "-9999";
  int fd = open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  uint32_t magic = core::StatsPage::kMagic;
  ASSERT_EQ(write(fd, &magic, sizeof magic), static_cast<ssize_t>(sizeof magic));
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  EXPECT_EXIT(
      {
        (void)core::StatsPage::read_all();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  unlink(path.c_str());
}

// A stats page whose owner (any user who widened SOFTRDMA_STATS_MODE, or made a file under a live
// pid's name) truncates and restores it while `softrdma stat` reads: the reader never dies of
// SIGBUS, and reads the page whole or skips it.
TEST(HostileLocal, StatsPageTruncatedWhileRead) {
  const std::string path = "/dev/shm/softrdma-stats-" + std::to_string(getpid()) + "-9998";
  int fd = open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  const size_t size = core::StatsPage::page_size();
  EXPECT_EXIT(
      {
        std::atomic<bool> stop{false};
        std::thread flip([&] {
          while (!stop.load()) {
            if (ftruncate(fd, 0) != 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) std::_Exit(3);
            uint32_t magic = core::StatsPage::kMagic;
            if (pwrite(fd, &magic, sizeof magic, 0) != static_cast<ssize_t>(sizeof magic)) std::_Exit(4);
          }
        });
        for (int i = 0; i < 3000; ++i) (void)core::StatsPage::read_all();
        stop.store(true);
        flip.join();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  close(fd);
  unlink(path.c_str());
}

}  // namespace
}  // namespace softrdma::hostile_test
