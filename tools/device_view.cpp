// The device view of `softrdma run` (device_view.h, docs/device-view.md): what the kernel's sysfs
// would show for our devices, and the mount namespace that shows it to one program.

#include "device_view.h"

#include <fmt/core.h>
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string_view>

// Exported by our libibverbs (and rdma-core's), declared only in rdma-core's private driver.h:
// the library's own answers for the sysfs files it knows.
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

namespace softrdma::tools {
namespace {

using Kind = ViewEntry::Kind;

// The kernel's uverbs character devices: major 231, minors from 192 (IB_UVERBS_BASE_MINOR).
constexpr unsigned kUverbsMajor = 231;
constexpr unsigned kUverbsBaseMinor = 192;
// The uverbs ABI of the kernel interface rdma-core 44 speaks (IB_USER_VERBS_ABI_VERSION).
constexpr int kUverbsAbi = 6;
constexpr const char* kDriverDir = "/sys/bus/softrdma/drivers/softrdma";

// The directories the view replaces, each by a tmpfs that holds the original entries (bind
// mounts, symlinks recreated) plus the view's own.
constexpr const char* kRoots[] = {"/sys/class", "/sys/bus", "/dev"};

std::string sysfs_guid(__be64 be) {
  const uint64_t g = be64toh(be);
  return fmt::format("{:04x}:{:04x}:{:04x}:{:04x}\n", (g >> 48) & 0xffff, (g >> 32) & 0xffff,
                     (g >> 16) & 0xffff, g & 0xffff);
}

// As the kernel's %pI6: eight groups of four hex digits.
std::string sysfs_gid(const ibv_gid& gid) {
  std::string s;
  for (int i = 0; i < 16; i += 2)
    s += fmt::format("{}{:02x}{:02x}", i ? ":" : "", gid.raw[i], gid.raw[i + 1]);
  return s + "\n";
}

std::string port_state_name(int s) {
  static const char* names[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
  return fmt::format("{}: {}\n", s, s >= 0 && s < 6 ? names[s] : "UNKNOWN");
}

std::string phys_state_name(int s) {
  static const char* names[] = {"",          "Sleep",     "Polling",           "Disabled",
                                "PortConfigurationTraining", "LinkUp", "LinkErrorRecovery",
                                "Phy Test"};
  return fmt::format("{}: {}\n", s, s >= 1 && s <= 7 ? names[s] : "<unknown>");
}

// The kernel's rate file: per-lane deci-Gb/s times the lane count, with the speed's name.
std::string rate_str(uint8_t speed, uint8_t width) {
  int lanes = width == 1 ? 1 : width == 2 ? 4 : width == 4 ? 8 : width == 8 ? 12 : width == 16 ? 2 : 1;
  int deci = 25;
  const char* name = "";
  switch (speed) {
    case 2: deci = 50, name = " DDR"; break;
    case 4: deci = 100, name = " QDR"; break;
    case 8: deci = 100, name = " FDR10"; break;
    case 16: deci = 140, name = " FDR"; break;
    case 32: deci = 250, name = " EDR"; break;
    case 64: deci = 500, name = " HDR"; break;
    case 128: deci = 1000, name = " NDR"; break;
    default: break;
  }
  int rate = deci * lanes;
  return fmt::format("{}{} Gb/sec ({}X{})\n", rate / 10, rate % 10 ? ".5" : "", lanes, name);
}

std::string gid_type_name(uint32_t t) {
  switch (t) {
    // The kernel's names (core/cache.c): one string for IB and RoCE v1 (an iWARP port's GIDs are IB).
    case IBV_GID_TYPE_IB:
    case IBV_GID_TYPE_ROCE_V1: return "IB/RoCE v1\n";
    default: return "RoCE v2\n";
  }
}

// The library's answer for one of the sysfs files it knows, else the fallback.
std::string lib_sysfs(ibv_device* dev, const char* file, const std::string& fallback) {
  char buf[128] = {};
  int n = ibv_read_sysfs_file(dev->ibdev_path, file, buf, sizeof buf);
  if (n <= 0) return fallback;
  std::string s(buf, strnlen(buf, sizeof buf));
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s + "\n";
}

void describe_one(ibv_device* dev, std::vector<ViewEntry>& out) {
  auto dir = [&](std::string p) { out.push_back({Kind::Dir, std::move(p), {}}); };
  auto file = [&](std::string p, std::string v) { out.push_back({Kind::File, std::move(p), std::move(v)}); };
  auto link = [&](std::string p, std::string t) { out.push_back({Kind::Link, std::move(p), std::move(t)}); };

  const std::string name = ibv_get_device_name(dev);
  const std::string uverbs = dev->dev_name;  // "uverbsN", numbered by the library
  unsigned n = 0;
  if (std::sscanf(uverbs.c_str(), "uverbs%u", &n) != 1) return;
  const std::string base = "/sys/class/infiniband/" + name;

  ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) return;
  ibv_device_attr a{};
  if (ibv_query_device(ctx, &a) != 0) {
    ibv_close_device(ctx);
    return;
  }
  dir(base);
  file(base + "/node_type", lib_sysfs(dev, "node_type", "1: CA"));
  file(base + "/node_guid", sysfs_guid(a.node_guid));
  file(base + "/sys_image_guid", sysfs_guid(a.sys_image_guid));
  file(base + "/fw_ver", lib_sysfs(dev, "fw_ver", a.fw_ver));
  file(base + "/node_desc", lib_sysfs(dev, "node_desc", name));
  file(base + "/hw_rev", fmt::format("0x{:x}\n", a.hw_ver));
  dir(base + "/ports");
  std::set<std::string> netdevs;
  for (int p = 1; p <= a.phys_port_cnt; ++p) {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, static_cast<uint8_t>(p), &pa) != 0) continue;
    const std::string pd = fmt::format("{}/ports/{}", base, p);
    dir(pd);
    file(pd + "/state", port_state_name(pa.state));
    file(pd + "/phys_state", phys_state_name(pa.phys_state));
    file(pd + "/link_layer", pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet\n" : "InfiniBand\n");
    file(pd + "/rate", rate_str(pa.active_speed, pa.active_width));
    file(pd + "/lid", fmt::format("0x{:x}\n", pa.lid));
    file(pd + "/sm_lid", fmt::format("0x{:x}\n", pa.sm_lid));
    file(pd + "/sm_sl", fmt::format("{}\n", pa.sm_sl));
    file(pd + "/lid_mask_count", fmt::format("{}\n", pa.lmc));
    file(pd + "/cap_mask", fmt::format("0x{:08x}\n", pa.port_cap_flags));
    dir(pd + "/gids");
    dir(pd + "/gid_attrs");
    dir(pd + "/gid_attrs/types");
    dir(pd + "/gid_attrs/ndevs");
    for (int i = 0; i < pa.gid_tbl_len; ++i) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(ctx, static_cast<uint32_t>(p), static_cast<uint32_t>(i), &e, 0) != 0) {
        // An empty slot: the kernel shows a zero GID, and its attributes cannot be read.
        file(fmt::format("{}/gids/{}", pd, i), sysfs_gid(ibv_gid{}));
        continue;
      }
      file(fmt::format("{}/gids/{}", pd, i), sysfs_gid(e.gid));
      file(fmt::format("{}/gid_attrs/types/{}", pd, i), gid_type_name(e.gid_type));
      char ifname[IF_NAMESIZE] = {};
      if (e.ndev_ifindex && if_indextoname(e.ndev_ifindex, ifname)) {
        file(fmt::format("{}/gid_attrs/ndevs/{}", pd, i), std::string(ifname) + "\n");
        netdevs.insert(ifname);
      }
    }
    dir(pd + "/pkeys");
    for (int i = 0; i < pa.pkey_tbl_len; ++i) {
      __be16 pkey = 0;
      if (ibv_query_pkey(ctx, static_cast<uint8_t>(p), i, &pkey) == 0)
        file(fmt::format("{}/pkeys/{}", pd, i), fmt::format("0x{:04x}\n", ntohs(pkey)));
    }
  }
  ibv_close_device(ctx);

  // The parent device: its network interfaces, and the driver that binds it.
  dir(base + "/device");
  dir(base + "/device/net");
  for (const auto& nd : netdevs) link(base + "/device/net/" + nd, "/sys/class/net/" + nd);
  link(base + "/device/driver", kDriverDir);

  const std::string uv = "/sys/class/infiniband_verbs/" + uverbs;
  dir(uv);
  file(uv + "/ibdev", name + "\n");
  file(uv + "/abi_version", fmt::format("{}\n", kUverbsAbi));
  file(uv + "/dev", fmt::format("{}:{}\n", kUverbsMajor, kUverbsBaseMinor + n));
  link(uv + "/device", base + "/device");
  out.push_back({Kind::Uverbs, "/dev/infiniband/" + uverbs, std::to_string(kUverbsBaseMinor + n)});
}

void describe_all(std::vector<ViewEntry>& out) {
  out.push_back({Kind::Dir, "/sys/class/infiniband", {}});
  out.push_back({Kind::Dir, "/sys/class/infiniband_verbs", {}});
  out.push_back({Kind::File, "/sys/class/infiniband_verbs/abi_version", fmt::format("{}\n", kUverbsAbi)});
  out.push_back({Kind::Dir, "/sys/bus/softrdma", {}});
  out.push_back({Kind::Dir, "/sys/bus/softrdma/devices", {}});
  out.push_back({Kind::Dir, "/sys/bus/softrdma/drivers", {}});
  out.push_back({Kind::Dir, kDriverDir, {}});
  out.push_back({Kind::Dir, "/dev/infiniband", {}});
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (!list) return;
  for (int i = 0; i < count; ++i) describe_one(list[i], out);
  ibv_free_device_list(list);
}

// Entries cross the pipe as: kind, path NUL, data NUL.
std::string serialize(const std::vector<ViewEntry>& v) {
  std::string s;
  for (const auto& e : v) {
    s += static_cast<char>(e.kind);
    s += e.path;
    s += '\0';
    s += e.data;
    s += '\0';
  }
  return s;
}

bool deserialize(const std::string& s, std::vector<ViewEntry>& out) {
  size_t i = 0;
  while (i < s.size()) {
    char k = s[i++];
    size_t z1 = s.find('\0', i);
    if (z1 == std::string::npos) return false;
    size_t z2 = s.find('\0', z1 + 1);
    if (z2 == std::string::npos) return false;
    out.push_back({static_cast<Kind>(k), s.substr(i, z1 - i), s.substr(z1 + 1, z2 - z1 - 1)});
    i = z2 + 1;
  }
  return true;
}

bool write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    s.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The mount namespace.

std::string err(const std::string& what) { return fmt::format("{}: {}", what, std::strerror(errno)); }

bool write_file(const char* path, const std::string& s) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = write_all(fd, s);
  close(fd);
  return ok;
}

bool under(const std::string& path, const std::string& root) {
  return path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/';
}

// The node an original entry is bound onto, of the entry's own type, so that readdir's d_type
// stays what it was. Without CAP_MKNOD (a user namespace) a character device can only be a
// whiteout (0:0), and a block device only a regular file (docs/device-view.md).
bool make_mount_point(const std::string& dst, mode_t mode, dev_t rdev) {
  const char* p = dst.c_str();
  const mode_t type = mode & S_IFMT;
  if (type == S_IFDIR) return mkdir(p, 0755) == 0;
  if (type == S_IFCHR || type == S_IFBLK || type == S_IFIFO || type == S_IFSOCK) {
    if (mknod(p, type | 0600, rdev) == 0) return true;
    if (type == S_IFCHR && mknod(p, S_IFCHR | 0600, makedev(0, 0)) == 0) return true;
  }
  int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// Creates one view entry. The uverbs node is the kernel's where mknod is allowed; in a user
// namespace it is refused, so /dev/null is bound in its place: a character device everyone may
// read and write, whose open is harmless.
bool make_entry(const ViewEntry& e, std::string& why) {
  const char* p = e.path.c_str();
  switch (e.kind) {
    case Kind::Dir:
      if (mkdir(p, 0755) != 0 && errno != EEXIST) return why = err("mkdir " + e.path), false;
      return true;
    case Kind::Link:
      if (symlink(e.data.c_str(), p) != 0) return why = err("symlink " + e.path), false;
      return true;
    case Kind::File: {
      int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
      if (fd < 0) return why = err("create " + e.path), false;
      bool ok = write_all(fd, e.data);
      close(fd);
      if (!ok) why = err("write " + e.path);
      return ok;
    }
    case Kind::Uverbs: {
      unsigned minor = static_cast<unsigned>(std::stoul(e.data));
      if (mknod(p, S_IFCHR | 0666, makedev(kUverbsMajor, minor)) == 0) return true;
      if (errno != EPERM) return why = err("mknod " + e.path), false;
      if (!make_mount_point(e.path, S_IFCHR, 0)) return why = err("create " + e.path), false;
      if (mount("/dev/null", p, nullptr, MS_BIND, nullptr) != 0)
        return why = err("bind /dev/null at " + e.path), false;
      return true;
    }
  }
  return false;
}

unsigned long mount_flags_of(const struct statvfs& sv) {
  unsigned long f = 0;
  if (sv.f_flag & ST_NOSUID) f |= MS_NOSUID;
  if (sv.f_flag & ST_NODEV) f |= MS_NODEV;
  if (sv.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
  return f;
}

// Replaces directory R by a tmpfs holding R's entries (the originals, reached through an fd
// opened before the tmpfs hid them) and the view's entries under R, which win on a name clash.
bool overlay(const std::string& r, const std::vector<ViewEntry>& entries, std::string& why) {
  std::set<std::string> ours;  // top-level names the view supplies
  for (const auto& e : entries)
    if (under(e.path, r)) ours.insert(e.path.substr(r.size() + 1, e.path.find('/', r.size() + 1) - r.size() - 1));

  int dfd = open(r.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return why = err("open " + r), false;
  struct stat st{};
  struct statvfs sv{};
  if (fstat(dfd, &st) != 0 || fstatvfs(dfd, &sv) != 0) {
    why = err("stat " + r);
    close(dfd);
    return false;
  }
  std::vector<std::pair<std::string, struct stat>> originals;
  if (DIR* d = fdopendir(dup(dfd))) {
    while (dirent* de = readdir(d)) {
      std::string name = de->d_name;
      if (name == "." || name == ".." || ours.count(name)) continue;
      struct stat es{};
      if (fstatat(dfd, name.c_str(), &es, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
      originals.emplace_back(name, es);
    }
    closedir(d);
  }

  const unsigned long flags = mount_flags_of(sv);
  // The original's owner, where this namespace maps it (not in a user namespace).
  const std::string mode = fmt::format("mode={:o}", st.st_mode & 07777);
  const std::string owned = fmt::format("{},uid={},gid={}", mode, st.st_uid, st.st_gid);
  if (mount("tmpfs", r.c_str(), "tmpfs", flags, owned.c_str()) != 0 &&
      mount("tmpfs", r.c_str(), "tmpfs", flags, mode.c_str()) != 0) {
    why = err("mount a tmpfs on " + r);
    close(dfd);
    return false;
  }
  bool ok = true;
  for (const auto& [name, es] : originals) {
    const std::string src = fmt::format("/proc/self/fd/{}/{}", dfd, name), dst = r + "/" + name;
    if (S_ISLNK(es.st_mode)) {
      char target[4096];
      ssize_t n = readlinkat(dfd, name.c_str(), target, sizeof target - 1);
      if (n < 0 || symlink(std::string(target, static_cast<size_t>(n)).c_str(), dst.c_str()) != 0) {
        why = err("recreate the link " + dst);
        ok = false;
        break;
      }
      continue;
    }
    ok = make_mount_point(dst, es.st_mode, es.st_rdev);
    // Recursive, so the mounts below (/dev/pts, /dev/shm, /dev/mqueue) stay what they are.
    if (!ok || mount(src.c_str(), dst.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
      why = err("bind " + r + "/" + name);
      ok = false;
      break;
    }
  }
  close(dfd);
  for (size_t i = 0; ok && i < entries.size(); ++i)
    if (under(entries[i].path, r)) ok = make_entry(entries[i], why);
  // Read-only as sysfs is, and so that a user cannot add files to what looks like the host's /dev.
  if (ok && mount(nullptr, r.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, nullptr) != 0) {
    why = err("remount " + r + " read-only");
    ok = false;
  }
  if (!ok) umount2(r.c_str(), MNT_DETACH);
  return ok;
}

bool build_view(const std::vector<ViewEntry>& entries, std::string& why) {
  // Nothing mounted here may reach the host's namespace; its mounts still reach us.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) return why = err("make / a slave"), false;
  // The view's modes are the kernel's, whatever the caller's umask.
  const mode_t mask = umask(0);
  std::vector<std::string> done;
  bool ok = true;
  for (const char* r : kRoots) {
    if (!overlay(r, entries, why)) {
      for (auto it = done.rbegin(); it != done.rend(); ++it) umount2(it->c_str(), MNT_DETACH);
      ok = false;
      break;
    }
    done.push_back(r);
  }
  umask(mask);
  return ok;
}

}  // namespace

bool describe_devices(std::vector<ViewEntry>& out, std::string& why) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return why = err("pipe"), false;
  pid_t pid = fork();
  if (pid < 0) {
    why = err("fork");
    close(fds[0]);
    close(fds[1]);
    return false;
  }
  if (pid == 0) {
    close(fds[0]);
    std::vector<ViewEntry> v;
    describe_all(v);
    _exit(write_all(fds[1], serialize(v)) ? 0 : 1);
  }
  close(fds[1]);
  std::string data;
  char buf[8192];
  for (;;) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return why = "listing the devices failed", false;
  if (!deserialize(data, out)) return why = "listing the devices failed (truncated)", false;
  return true;
}

ViewMode enter_device_view(const std::vector<ViewEntry>& entries, std::string& why) {
  if (geteuid() == 0) {
    if (unshare(CLONE_NEWNS) == 0) return build_view(entries, why) ? ViewMode::Root : ViewMode::None;
    // A root without CAP_SYS_ADMIN (a container) may still create a user namespace.
  }
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
    why = err("cannot create a user and mount namespace");
    return ViewMode::None;
  }
  // Without setgroups denied the kernel refuses a gid map from an unprivileged writer.
  if (!write_file("/proc/self/setgroups", "deny") ||
      !write_file("/proc/self/uid_map", fmt::format("{} {} 1\n", uid, uid)) ||
      !write_file("/proc/self/gid_map", fmt::format("{} {} 1\n", gid, gid))) {
    why = err("cannot map the uid and gid in a user namespace");
    return ViewMode::None;
  }
  return build_view(entries, why) ? ViewMode::UserNamespace : ViewMode::None;
}

const char* view_mode_name(ViewMode m) {
  switch (m) {
    case ViewMode::Root: return "mount namespace";
    case ViewMode::UserNamespace: return "user and mount namespace";
    case ViewMode::None: break;
  }
  return "none";
}

}  // namespace softrdma::tools
