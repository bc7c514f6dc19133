// The device view of `softrdma run`: a private mount namespace in which the kernel's places for
// RDMA devices (/sys/class/infiniband, /sys/class/infiniband_verbs, /dev/infiniband) show the
// devices our libibverbs offers, for consumers (UCX, Open MPI, rdma-core's tests) that look there.
// docs/device-view.md describes the mechanism and its limits.
#pragma once

#include <string>
#include <vector>

namespace softrdma::tools {

// One node of the view, by absolute path. Directories come before what they hold.
struct ViewEntry {
  enum class Kind : char { Dir = 'd', File = 'f', Link = 'l', Uverbs = 'c' };
  Kind kind;
  std::string path;
  std::string data;  // File: contents; Link: target; Uverbs: the char device's minor
};

// What the view shows for every device of our library, queried through the verbs API in a
// child process (opening a device starts threads, and a user namespace needs a single thread).
// Returns false with a reason when the devices cannot be listed.
bool describe_devices(std::vector<ViewEntry>& out, std::string& why);

enum class ViewMode { Root, UserNamespace, None };

// Moves the calling (single-threaded) process into a new mount namespace, with a user namespace
// that maps its uid and gid to themselves when it is not root, and builds the view there. The
// host's /sys and /dev are never written. Returns None, with the reason, when neither works; the
// process then stays as it was, except that a user namespace may already have been entered.
ViewMode enter_device_view(const std::vector<ViewEntry>& entries, std::string& why);

const char* view_mode_name(ViewMode m);

}  // namespace softrdma::tools
