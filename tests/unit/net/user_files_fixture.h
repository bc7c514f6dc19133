// A test fixture for tests whose object keeps its state in per-user files (net/user_files.h): each test
// gets its own path, and the files are removed before and after it.
#pragma once

#include <unistd.h>

#include <atomic>
#include <string>

#include <gtest/gtest.h>

#include "net/user_files.h"

namespace softrdma::net {

// Gives each test a fresh path /dev/shm/<prefix><pid>-<n> and removes its user files around the test.
class UserFilesTest : public ::testing::Test {
 protected:
  explicit UserFilesTest(const char* prefix) : prefix_(prefix) {}
  void SetUp() override {
    static std::atomic<int> n{0};
    path_ = "/dev/shm/";
    path_.append(prefix_).append(std::to_string(getpid())).append("-").append(std::to_string(n++));
    remove_files();
  }
  void TearDown() override { remove_files(); }
  // The files live at <path_>-u<uid>[.<k>] (net/user_files.h).
  std::string own_file() const {
    std::string f = path_;
    f.append("-u").append(std::to_string(geteuid()));
    return f;
  }
  void remove_files() const {
    unlink(own_file().c_str());
    for (int k = 1; k < UserFiles::kMaxSuffix; ++k) {
      std::string f = own_file();
      f.append(".").append(std::to_string(k));
      unlink(f.c_str());
    }
  }
  const char* prefix_;
  std::string path_;
};

}  // namespace softrdma::net
