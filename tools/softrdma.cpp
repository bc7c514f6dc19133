// The softrdma command: lists the devices our libibverbs offers, and runs unmodified RDMA
// programs over our libraries, in a view that shows the devices where the kernel would
// (device_view.h), optionally capturing their packets (net/capture.h). `devices` uses only the public verbs API, so what it prints is
// exactly what any verbs program sees. `config` lists the environment variables (config/config.h).

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <endian.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/stats.h"
#include "device_view.h"
#include "net/capture.h"

namespace softrdma::tools {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Formatting of verbs values, in the words ibv_devinfo uses so outputs can be compared.

std::string port_state_str(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return "PORT_NOP";
    case IBV_PORT_DOWN: return "PORT_DOWN";
    case IBV_PORT_INIT: return "PORT_INIT";
    case IBV_PORT_ARMED: return "PORT_ARMED";
    case IBV_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "PORT_ACTIVE_DEFER";
  }
  return fmt::format("invalid state ({})", static_cast<int>(s));
}

std::string mtu_str(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256: return "256";
    case IBV_MTU_512: return "512";
    case IBV_MTU_1024: return "1024";
    case IBV_MTU_2048: return "2048";
    case IBV_MTU_4096: return "4096";
  }
  return fmt::format("invalid MTU ({})", static_cast<int>(m));
}

std::string link_layer_str(uint8_t ll) {
  switch (ll) {
    case IBV_LINK_LAYER_UNSPECIFIED:
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return fmt::format("Unknown ({})", ll);
  }
}

std::string transport_str(ibv_transport_type t) {
  switch (t) {
    case IBV_TRANSPORT_IB: return "InfiniBand";
    case IBV_TRANSPORT_IWARP: return "iWARP";
    case IBV_TRANSPORT_USNIC: return "usNIC";
    case IBV_TRANSPORT_USNIC_UDP: return "usNIC UDP";
    case IBV_TRANSPORT_UNSPECIFIED: return "unspecified";
    case IBV_TRANSPORT_UNKNOWN: break;
  }
  return fmt::format("unknown ({})", static_cast<int>(t));
}

std::string gid_type_str(uint32_t t) {
  switch (t) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    default: return fmt::format("unknown ({})", t);
  }
}

std::string atomic_cap_str(ibv_atomic_cap c) {
  switch (c) {
    case IBV_ATOMIC_NONE: return "ATOMIC_NONE";
    case IBV_ATOMIC_HCA: return "ATOMIC_HCA";
    case IBV_ATOMIC_GLOB: return "ATOMIC_GLOB";
  }
  return fmt::format("invalid ({})", static_cast<int>(c));
}

// GUIDs are big-endian on the wire and in the verbs structs; print them as ibv_devinfo does.
std::string guid_str(__be64 guid_be) {
  const uint64_t g = be64toh(guid_be);
  return fmt::format("{:04x}:{:04x}:{:04x}:{:04x}", (g >> 48) & 0xffff, (g >> 32) & 0xffff,
                     (g >> 16) & 0xffff, g & 0xffff);
}

// A RoCEv2 GID of an IPv4 address is ::ffff:a.b.c.d, which inet_ntop renders that way.
std::string gid_str(const ibv_gid& gid) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (!inet_ntop(AF_INET6, gid.raw, buf, sizeof buf)) return "?";
  return buf;
}

bool gid_is_zero(const ibv_gid& gid) {
  for (uint8_t b : gid.raw)
    if (b) return false;
  return true;
}

// The IPv4 address a RoCEv2 GID carries, if it is an IPv4-mapped one.
std::optional<std::string> gid_ipv4(const ibv_gid& gid) {
  static constexpr uint8_t mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(gid.raw, mapped_prefix, sizeof mapped_prefix) != 0) return std::nullopt;
  char buf[INET_ADDRSTRLEN] = {};
  if (!inet_ntop(AF_INET, gid.raw + 12, buf, sizeof buf)) return std::nullopt;
  return std::string(buf);
}

std::string flags_str(uint64_t flags, std::initializer_list<std::pair<uint64_t, const char*>> names) {
  std::string out;
  for (const auto& [bit, name] : names) {
    if (flags & bit) {
      out += fmt::format("\n\t\t\t\t\t{}", name);
      flags &= ~bit;
    }
  }
  if (flags) out += fmt::format("\n\t\t\t\t\tUnknown flags: 0x{:x}", flags);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Device enumeration.

struct GidRow {
  int index;
  ibv_gid gid;
  std::optional<uint32_t> type;  // absent when the library cannot tell
};

// Reads the GID table entry through the extended query (type included); falls back to the
// legacy query when the library does not implement it.
std::optional<GidRow> query_gid(ibv_context* ctx, uint8_t port, int index) {
  ibv_gid_entry entry{};
  int rc = ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(index), &entry, 0);
  if (rc == 0) return GidRow{index, entry.gid, entry.gid_type};
  // ENODATA: an empty slot (some libraries return it negated); else try the old call.
  if (rc == ENODATA || rc == -ENODATA) return std::nullopt;
  ibv_gid gid{};
  if (ibv_query_gid(ctx, port, index, &gid) != 0 || gid_is_zero(gid)) return std::nullopt;
  return GidRow{index, gid, std::nullopt};
}

std::vector<GidRow> gid_table(ibv_context* ctx, uint8_t port, const ibv_port_attr& pa) {
  std::vector<GidRow> rows;
  for (int i = 0; i < pa.gid_tbl_len; ++i) {
    auto row = query_gid(ctx, port, i);
    if (row && !gid_is_zero(row->gid)) rows.push_back(*row);
  }
  return rows;
}

struct DeviceList {
  int count = 0;
  ibv_device** list = nullptr;
  DeviceList() { list = ibv_get_device_list(&count); }
  ~DeviceList() {
    if (list) ibv_free_device_list(list);
  }
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;
};

struct Context {
  ibv_context* ctx = nullptr;
  explicit Context(ibv_device* dev) : ctx(ibv_open_device(dev)) {}
  ~Context() {
    if (ctx) ibv_close_device(ctx);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};

void print_device_limits(const ibv_device_attr_ex& ax, bool have_ex) {
  const ibv_device_attr& a = ax.orig_attr;
  fmt::print("\tmax_mr_size:\t\t\t0x{:x}\n", a.max_mr_size);
  fmt::print("\tpage_size_cap:\t\t\t0x{:x}\n", a.page_size_cap);
  fmt::print("\tmax_qp:\t\t\t\t{}\n", a.max_qp);
  fmt::print("\tmax_qp_wr:\t\t\t{}\n", a.max_qp_wr);
  fmt::print("\tdevice_cap_flags:\t\t0x{:08x}{}\n", static_cast<unsigned>(a.device_cap_flags),
             flags_str(a.device_cap_flags,
                       {{IBV_DEVICE_RESIZE_MAX_WR, "RESIZE_MAX_WR"},
                        {IBV_DEVICE_BAD_PKEY_CNTR, "BAD_PKEY_CNTR"},
                        {IBV_DEVICE_BAD_QKEY_CNTR, "BAD_QKEY_CNTR"},
                        {IBV_DEVICE_RAW_MULTI, "RAW_MULTI"},
                        {IBV_DEVICE_AUTO_PATH_MIG, "AUTO_PATH_MIG"},
                        {IBV_DEVICE_CHANGE_PHY_PORT, "CHANGE_PHY_PORT"},
                        {IBV_DEVICE_UD_AV_PORT_ENFORCE, "UD_AV_PORT_ENFORCE"},
                        {IBV_DEVICE_CURR_QP_STATE_MOD, "CURR_QP_STATE_MOD"},
                        {IBV_DEVICE_SHUTDOWN_PORT, "SHUTDOWN_PORT"},
                        {IBV_DEVICE_INIT_TYPE, "INIT_TYPE"},
                        {IBV_DEVICE_PORT_ACTIVE_EVENT, "PORT_ACTIVE_EVENT"},
                        {IBV_DEVICE_SYS_IMAGE_GUID, "SYS_IMAGE_GUID"},
                        {IBV_DEVICE_RC_RNR_NAK_GEN, "RC_RNR_NAK_GEN"},
                        {IBV_DEVICE_SRQ_RESIZE, "SRQ_RESIZE"},
                        {IBV_DEVICE_N_NOTIFY_CQ, "N_NOTIFY_CQ"},
                        {IBV_DEVICE_MEM_WINDOW, "MEM_WINDOW"},
                        {IBV_DEVICE_UD_IP_CSUM, "UD_IP_CSUM"},
                        {IBV_DEVICE_XRC, "XRC"},
                        {IBV_DEVICE_MEM_MGT_EXTENSIONS, "MEM_MGT_EXTENSIONS"},
                        {IBV_DEVICE_MEM_WINDOW_TYPE_2A, "MEM_WINDOW_TYPE_2A"},
                        {IBV_DEVICE_MEM_WINDOW_TYPE_2B, "MEM_WINDOW_TYPE_2B"},
                        {IBV_DEVICE_RC_IP_CSUM, "RC_IP_CSUM"},
                        {IBV_DEVICE_RAW_IP_CSUM, "RAW_IP_CSUM"},
                        {IBV_DEVICE_MANAGED_FLOW_STEERING, "MANAGED_FLOW_STEERING"}}));
  fmt::print("\tmax_sge:\t\t\t{}\n", a.max_sge);
  fmt::print("\tmax_sge_rd:\t\t\t{}\n", a.max_sge_rd);
  fmt::print("\tmax_cq:\t\t\t\t{}\n", a.max_cq);
  fmt::print("\tmax_cqe:\t\t\t{}\n", a.max_cqe);
  fmt::print("\tmax_mr:\t\t\t\t{}\n", a.max_mr);
  fmt::print("\tmax_pd:\t\t\t\t{}\n", a.max_pd);
  fmt::print("\tmax_qp_rd_atom:\t\t\t{}\n", a.max_qp_rd_atom);
  fmt::print("\tmax_ee_rd_atom:\t\t\t{}\n", a.max_ee_rd_atom);
  fmt::print("\tmax_res_rd_atom:\t\t{}\n", a.max_res_rd_atom);
  fmt::print("\tmax_qp_init_rd_atom:\t\t{}\n", a.max_qp_init_rd_atom);
  fmt::print("\tmax_ee_init_rd_atom:\t\t{}\n", a.max_ee_init_rd_atom);
  fmt::print("\tatomic_cap:\t\t\t{} ({})\n", atomic_cap_str(a.atomic_cap),
             static_cast<int>(a.atomic_cap));
  fmt::print("\tmax_ee:\t\t\t\t{}\n", a.max_ee);
  fmt::print("\tmax_rdd:\t\t\t{}\n", a.max_rdd);
  fmt::print("\tmax_mw:\t\t\t\t{}\n", a.max_mw);
  fmt::print("\tmax_raw_ipv6_qp:\t\t{}\n", a.max_raw_ipv6_qp);
  fmt::print("\tmax_raw_ethy_qp:\t\t{}\n", a.max_raw_ethy_qp);
  fmt::print("\tmax_mcast_grp:\t\t\t{}\n", a.max_mcast_grp);
  fmt::print("\tmax_mcast_qp_attach:\t\t{}\n", a.max_mcast_qp_attach);
  fmt::print("\tmax_total_mcast_qp_attach:\t{}\n", a.max_total_mcast_qp_attach);
  fmt::print("\tmax_ah:\t\t\t\t{}\n", a.max_ah);
  fmt::print("\tmax_fmr:\t\t\t{}\n", a.max_fmr);
  fmt::print("\tmax_srq:\t\t\t{}\n", a.max_srq);
  fmt::print("\tmax_srq_wr:\t\t\t{}\n", a.max_srq_wr);
  fmt::print("\tmax_srq_sge:\t\t\t{}\n", a.max_srq_sge);
  fmt::print("\tmax_pkeys:\t\t\t{}\n", a.max_pkeys);
  fmt::print("\tlocal_ca_ack_delay:\t\t{}\n", a.local_ca_ack_delay);
  if (!have_ex) return;
  fmt::print("\tgeneral_odp_caps:\t\t0x{:x}\n", ax.odp_caps.general_caps);
  fmt::print("\tcompletion_timestamp_mask:\t0x{:x}\n", ax.completion_timestamp_mask);
  fmt::print("\thca_core_clock:\t\t\t{} kHz\n", ax.hca_core_clock);
  fmt::print("\tdevice_cap_flags_ex:\t\t0x{:x}\n", ax.device_cap_flags_ex);
  fmt::print("\tmax_tso:\t\t\t{}\n", ax.tso_caps.max_tso);
  fmt::print("\tmax_rwq_indirection_tables:\t{}\n", ax.rss_caps.max_rwq_indirection_tables);
  fmt::print("\tmax_wq_type_rq:\t\t\t{}\n", ax.max_wq_type_rq);
  fmt::print("\traw_packet_caps:\t\t0x{:x}\n", ax.raw_packet_caps);
  fmt::print("\tmax_cq_moderation_count:\t{}\n", ax.cq_mod_caps.max_cq_count);
  fmt::print("\tmax_cq_moderation_period:\t{} us\n", ax.cq_mod_caps.max_cq_period);
  fmt::print("\tmaximum available device memory:\t{} bytes\n", ax.max_dm_size);
  fmt::print("\tphys_port_cnt_ex:\t\t{}\n", ax.phys_port_cnt_ex);
}

void print_port_limits(const ibv_port_attr& p) {
  fmt::print("\t\t\tmax_msg_sz:\t\t0x{:x}\n", p.max_msg_sz);
  fmt::print("\t\t\tport_cap_flags:\t\t0x{:08x}{}\n", p.port_cap_flags,
             flags_str(p.port_cap_flags,
                       {{IBV_PORT_SM, "SM"},
                        {IBV_PORT_NOTICE_SUP, "NOTICE_SUP"},
                        {IBV_PORT_TRAP_SUP, "TRAP_SUP"},
                        {IBV_PORT_OPT_IPD_SUP, "OPT_IPD_SUP"},
                        {IBV_PORT_AUTO_MIGR_SUP, "AUTO_MIGR_SUP"},
                        {IBV_PORT_SL_MAP_SUP, "SL_MAP_SUP"},
                        {IBV_PORT_MKEY_NVRAM, "MKEY_NVRAM"},
                        {IBV_PORT_PKEY_NVRAM, "PKEY_NVRAM"},
                        {IBV_PORT_LED_INFO_SUP, "LED_INFO_SUP"},
                        {IBV_PORT_SYS_IMAGE_GUID_SUP, "SYS_IMAGE_GUID_SUP"},
                        {IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP, "PKEY_SW_EXT_PORT_TRAP_SUP"},
                        {IBV_PORT_EXTENDED_SPEEDS_SUP, "EXTENDED_SPEEDS_SUP"},
                        {IBV_PORT_CAP_MASK2_SUP, "CAP_MASK2_SUP"},
                        {IBV_PORT_CM_SUP, "CM_SUP"},
                        {IBV_PORT_SNMP_TUNNEL_SUP, "SNMP_TUNNEL_SUP"},
                        {IBV_PORT_REINIT_SUP, "REINIT_SUP"},
                        {IBV_PORT_DEVICE_MGMT_SUP, "DEVICE_MGMT_SUP"},
                        {IBV_PORT_VENDOR_CLASS_SUP, "VENDOR_CLASS_SUP"},
                        {IBV_PORT_DR_NOTICE_SUP, "DR_NOTICE_SUP"},
                        {IBV_PORT_CAP_MASK_NOTICE_SUP, "CAP_MASK_NOTICE_SUP"},
                        {IBV_PORT_BOOT_MGMT_SUP, "BOOT_MGMT_SUP"},
                        {IBV_PORT_LINK_LATENCY_SUP, "LINK_LATENCY_SUP"},
                        {IBV_PORT_CLIENT_REG_SUP, "CLIENT_REG_SUP"},
                        {IBV_PORT_IP_BASED_GIDS, "IP_BASED_GIDS"}}));
  fmt::print("\t\t\tmax_vl_num:\t\t{}\n", p.max_vl_num);
  fmt::print("\t\t\tbad_pkey_cntr:\t\t0x{:x}\n", p.bad_pkey_cntr);
  fmt::print("\t\t\tqkey_viol_cntr:\t\t0x{:x}\n", p.qkey_viol_cntr);
  fmt::print("\t\t\tsm_sl:\t\t\t{}\n", p.sm_sl);
  fmt::print("\t\t\tpkey_tbl_len:\t\t{}\n", p.pkey_tbl_len);
  fmt::print("\t\t\tgid_tbl_len:\t\t{}\n", p.gid_tbl_len);
  fmt::print("\t\t\tsubnet_timeout:\t\t{}\n", p.subnet_timeout);
  fmt::print("\t\t\tinit_type_reply:\t{}\n", p.init_type_reply);
  fmt::print("\t\t\tactive_width:\t\t{}\n", p.active_width);
  fmt::print("\t\t\tactive_speed:\t\t{}\n", p.active_speed);
  fmt::print("\t\t\tphys_state:\t\t{}\n", p.phys_state);
}

// Prints one device; returns false when it could not be opened or queried.
bool print_device(ibv_device* dev, bool verbose) {
  const char* name = ibv_get_device_name(dev);
  Context c(dev);
  if (!c.ctx) {
    fmt::print(stderr, "softrdma: cannot open {}: {}\n", name, std::strerror(errno));
    return false;
  }
  ibv_device_attr_ex ax{};
  bool have_ex = ibv_query_device_ex(c.ctx, nullptr, &ax) == 0;
  if (!have_ex && ibv_query_device(c.ctx, &ax.orig_attr) != 0) {
    fmt::print(stderr, "softrdma: cannot query {}: {}\n", name, std::strerror(errno));
    return false;
  }
  const ibv_device_attr& a = ax.orig_attr;
  fmt::print("hca_id:\t{}\n", name);
  fmt::print("\ttransport:\t\t\t{} ({})\n", transport_str(dev->transport_type),
             static_cast<int>(dev->transport_type));
  fmt::print("\tfw_ver:\t\t\t\t{}\n", a.fw_ver);
  fmt::print("\tnode_guid:\t\t\t{}\n", guid_str(a.node_guid));
  fmt::print("\tsys_image_guid:\t\t\t{}\n", guid_str(a.sys_image_guid));
  fmt::print("\tvendor_id:\t\t\t0x{:04x}\n", a.vendor_id);
  fmt::print("\tvendor_part_id:\t\t\t{}\n", a.vendor_part_id);
  fmt::print("\thw_ver:\t\t\t\t0x{:X}\n", a.hw_ver);
  fmt::print("\tphys_port_cnt:\t\t\t{}\n", static_cast<int>(a.phys_port_cnt));
  if (verbose) print_device_limits(ax, have_ex);

  bool ok = true;
  for (int port = 1; port <= a.phys_port_cnt; ++port) {
    ibv_port_attr pa{};
    if (ibv_query_port(c.ctx, static_cast<uint8_t>(port), &pa) != 0) {
      fmt::print(stderr, "softrdma: cannot query port {} of {}: {}\n", port, name,
                 std::strerror(errno));
      ok = false;
      continue;
    }
    fmt::print("\t\tport:\t{}\n", port);
    fmt::print("\t\t\tstate:\t\t\t{} ({})\n", port_state_str(pa.state), static_cast<int>(pa.state));
    fmt::print("\t\t\tmax_mtu:\t\t{} ({})\n", mtu_str(pa.max_mtu), static_cast<int>(pa.max_mtu));
    fmt::print("\t\t\tactive_mtu:\t\t{} ({})\n", mtu_str(pa.active_mtu),
               static_cast<int>(pa.active_mtu));
    fmt::print("\t\t\tlink_layer:\t\t{}\n", link_layer_str(pa.link_layer));
    if (verbose) print_port_limits(pa);
    for (const GidRow& g : gid_table(c.ctx, static_cast<uint8_t>(port), pa)) {
      auto ip = gid_ipv4(g.gid);
      fmt::print("\t\t\tGID[{:3}]:\t\t{}, {}{}\n", g.index, gid_str(g.gid),
                 g.type ? gid_type_str(*g.type) : std::string("type unknown"),
                 ip ? fmt::format(" (IPv4 {})", *ip) : std::string());
    }
  }
  fmt::print("\n");
  return ok;
}

int cmd_devices(bool verbose, const std::string& only_dev) {
  DeviceList dl;
  if (!dl.list) {
    fmt::print(stderr, "softrdma: failed to get the device list: {}\n", std::strerror(errno));
    return 1;
  }
  if (dl.count == 0) {
    fmt::print(stderr, "softrdma: no devices found\n");
    return 1;
  }
  bool ok = true, found = only_dev.empty();
  for (int i = 0; i < dl.count; ++i) {
    if (!only_dev.empty() && only_dev != ibv_get_device_name(dl.list[i])) continue;
    found = true;
    ok = print_device(dl.list[i], verbose) && ok;
  }
  if (!found) {
    fmt::print(stderr, "softrdma: no device named {}\n", only_dev);
    return 1;
  }
  return ok ? 0 : 1;
}

// For scripts: the names of the devices whose GID table holds the RoCEv2 GID of an address (IPv4:
// ::ffff:a.b.c.d; IPv6: the address), and the iWARP devices bound to it.
int cmd_devices_for_ip(const std::string& ip) {
  in_addr want{};
  ibv_gid want_gid{};
  if (inet_pton(AF_INET, ip.c_str(), &want) == 1) {
    want_gid.raw[10] = want_gid.raw[11] = 0xFF;
    std::memcpy(want_gid.raw + 12, &want, 4);
  } else if (inet_pton(AF_INET6, ip.c_str(), want_gid.raw) != 1 ||
             std::all_of(want_gid.raw, want_gid.raw + 16, [](uint8_t b) { return b == 0; })) {
    fmt::print(stderr, "softrdma: not an IP address of an interface: {}\n", ip);
    return 2;
  }
  DeviceList dl;
  if (!dl.list) {
    fmt::print(stderr, "softrdma: failed to get the device list: {}\n", std::strerror(errno));
    return 1;
  }
  int matches = 0;
  for (int i = 0; i < dl.count; ++i) {
    Context c(dl.list[i]);
    if (!c.ctx) continue;
    ibv_device_attr a{};
    if (ibv_query_device(c.ctx, &a) != 0) continue;
    bool hit = false;
    // An iWARP GID holds the MAC: the library says which address the device is bound to.
    if (dl.list[i]->transport_type == IBV_TRANSPORT_IWARP) {
      using IpFn = int (*)(ibv_device*, uint8_t*);
      auto fn = reinterpret_cast<IpFn>(dlsym(RTLD_DEFAULT, "softrdma_device_ip"));
      uint8_t bound[16];
      hit = fn && fn(dl.list[i], bound) == 0 && std::memcmp(bound, want_gid.raw, sizeof bound) == 0;
    }
    for (int port = 1; port <= a.phys_port_cnt && !hit && dl.list[i]->transport_type != IBV_TRANSPORT_IWARP;
         ++port) {
      ibv_port_attr pa{};
      if (ibv_query_port(c.ctx, static_cast<uint8_t>(port), &pa) != 0) continue;
      for (const GidRow& g : gid_table(c.ctx, static_cast<uint8_t>(port), pa)) {
        if (std::memcmp(g.gid.raw, want_gid.raw, sizeof want_gid.raw) == 0) {
          hit = true;
          break;
        }
      }
    }
    if (hit) {
      fmt::print("{}\n", ibv_get_device_name(dl.list[i]));
      ++matches;
    }
  }
  if (matches == 0) {
    fmt::print(stderr, "softrdma: no device has a GID for {}\n", ip);
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// `run`: the environment that makes an unmodified program load our libraries.

fs::path self_exe_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : exe.parent_path();
}

// Where the libraries a program is given may be, relative to this command: the installed layout
// keeps them in a private directory (SOFTRDMA_INSTALL_RELDIR, never the system's libibverbs
// directory), the build tree next to bin/. The first that holds libibverbs.so.1 is used.
std::vector<fs::path> lib_dir_candidates() {
  std::vector<fs::path> dirs;
  for (const char* rel : {SOFTRDMA_INSTALL_RELDIR, "../lib"}) {
    std::error_code ec;
    fs::path dir = fs::weakly_canonical(self_exe_dir() / rel, ec);
    dirs.push_back(ec ? self_exe_dir() / rel : dir);
  }
  return dirs;
}

fs::path lib_dir() {
  if (const std::string env = config::parse().lib_dir; !env.empty()) return fs::path(env);
  auto dirs = lib_dir_candidates();
  for (const fs::path& dir : dirs) {
    std::error_code ec;
    if (fs::exists(dir / "libibverbs.so.1", ec)) return dir;
  }
  return dirs.front();
}

std::string gcc_runtime(const char* name) {
  std::string cmd = fmt::format("gcc -print-file-name={} 2>/dev/null", name);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {};
  char buf[4096] = {};
  std::string out = fgets(buf, sizeof buf, p) ? buf : "";
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  // gcc echoes the bare name back when it does not know the file.
  if (out.empty() || out.front() != '/') return {};
  return out;
}

// The sanitizer runtimes to preload, or nothing when the libraries are not instrumented. The
// build writes the list into the marker; an empty marker means "ask gcc".
std::vector<std::string> sanitizer_preloads(const fs::path& libdir) {
  fs::path marker = libdir / "SANITIZED";
  std::error_code ec;
  if (!fs::exists(marker, ec)) return {};
  std::vector<std::string> libs;
  std::ifstream in(marker);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.front() == '/') libs.push_back(line);
  if (libs.empty()) {
    for (const char* rt : {"libasan.so", "libubsan.so"})
      if (auto p = gcc_runtime(rt); !p.empty()) libs.push_back(p);
  }
  return libs;
}

std::string prepend_list(const std::string& head, const char* tail, char sep) {
  if (!tail || !*tail) return head;
  return head + sep + tail;
}

// Where the devices are shown as the kernel would (device_view.h), unless the user opted out.
void show_devices(bool want_view, bool print_env) {
  if (!want_view || !config::parse().view) return;
  std::vector<ViewEntry> entries;
  std::string why;
  ViewMode mode = ViewMode::None;
  if (describe_devices(entries, why)) mode = enter_device_view(entries, why);
  if (mode == ViewMode::None)
    fmt::print(stderr, "softrdma run: running without the device view ({})\n", why);
  else if (print_env)
    fmt::print(stderr, "softrdma run: device view: {}\n", view_mode_name(mode));
}

int cmd_run(const std::vector<std::string>& argv_in, bool print_env, bool want_view, bool iwarp) {
  // --iwarp: the program sees a siw-like host, iWARP devices only (docs/iwarp.md); set before the
  // device view lists the devices.
  if (iwarp) setenv("SOFTRDMA_TRANSPORT", "iwarp", 1);
  if (argv_in.empty()) {
    fmt::print(stderr, "softrdma run: no program given\n");
    return 2;
  }
  fs::path libdir = lib_dir();
  std::error_code ec;
  if (!fs::exists(libdir / "libibverbs.so.1", ec)) {
    std::string looked = libdir.string();
    if (config::parse().lib_dir.empty())
      for (const fs::path& dir : lib_dir_candidates())
        if (dir != libdir) looked += " nor " + dir.string();
    fmt::print(stderr, "softrdma run: {} holds no libibverbs.so.1 (build it, or set SOFTRDMA_LIB_DIR)\n",
               looked);
    return 127;
  }
  show_devices(want_view, print_env);
  std::string ld_path = prepend_list(libdir.string(), std::getenv("LD_LIBRARY_PATH"), ':');
  setenv("LD_LIBRARY_PATH", ld_path.c_str(), 1);
  auto preloads = sanitizer_preloads(libdir);
  if (!preloads.empty()) {
    // The ASan runtime must come first in the link map, so it goes before any user preload.
    std::string pre;
    for (const auto& p : preloads) pre += (pre.empty() ? "" : ":") + p;
    setenv("LD_PRELOAD", prepend_list(pre, std::getenv("LD_PRELOAD"), ':').c_str(), 1);
    // Unmodified programs leak on exit by design; a leak report would turn a pass into a fail.
    setenv("ASAN_OPTIONS", prepend_list("detect_leaks=0", std::getenv("ASAN_OPTIONS"), ':').c_str(),
           1);
  }
  // Open MPI takes pml ucx only on devices whose driver is mlx*, unless told otherwise.
  setenv("OMPI_MCA_opal_common_ucx_devices", "any", 0);
  if (print_env) {
    for (const char* var :
         {"LD_LIBRARY_PATH", "LD_PRELOAD", "ASAN_OPTIONS", "OMPI_MCA_opal_common_ucx_devices", "SOFTRDMA_TRANSPORT"})
      if (const char* v = std::getenv(var)) fmt::print(stderr, "softrdma run: {}={}\n", var, v);
  }
  std::vector<char*> argv;
  for (const auto& a : argv_in) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  int err = errno;
  fmt::print(stderr, "softrdma run: cannot execute {}: {}\n", argv_in[0], std::strerror(err));
  return err == ENOENT ? 127 : 126;
}

// `capture`: `run`, with every RoCE packet of PROGRAM (and of the processes it starts, which inherit
// SOFTRDMA_CAPTURE) appended to a fresh pcapng file (net/capture.h).
int cmd_capture(const std::string& file, const std::vector<std::string>& argv_in, bool print_env, bool want_view,
                bool iwarp) {
  if (file.empty()) {
    fmt::print(stderr, "softrdma capture: -w FILE is required\n");
    return 2;
  }
  int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || !net::Capture::write_header(fd)) {
    fmt::print(stderr, "softrdma capture: cannot write {}: {}\n", file, std::strerror(errno));
    if (fd >= 0) close(fd);
    return 1;
  }
  close(fd);
  std::error_code ec;
  const fs::path abs = fs::absolute(file, ec);
  setenv("SOFTRDMA_CAPTURE", ec ? file.c_str() : abs.c_str(), 1);
  if (print_env) fmt::print(stderr, "softrdma capture: SOFTRDMA_CAPTURE={}\n", std::getenv("SOFTRDMA_CAPTURE"));
  return cmd_run(argv_in, print_env, want_view, iwarp);
}

// Live counters of every softrdma context on this host, read from their shared-memory stats pages.
int cmd_stat(bool per_qp, bool all) {
  auto snaps = core::StatsPage::read_all();
  if (snaps.empty()) {
    fmt::print("no running softrdma process\n");
    return 0;
  }
  const auto& names = core::counter_names();
  auto print_set = [&](const core::Counters& c) {
    const uint64_t* v = core::counter_values(c);
    std::string line;
    for (size_t i = 0; i < names.size(); ++i)
      if (all || v[i]) line += fmt::format(" {} {}", names[i], v[i]);
    return line;
  };
  for (const auto& s : snaps) {
    fmt::print("pid {} link {}/1:{}\n", s.pid, s.device, print_set(s.device_counters));
    if (!per_qp) continue;
    for (const auto& q : s.qps)
      fmt::print("pid {} link {}/1 qpn {:#x} dest_qpn {:#x}:{}\n", s.pid, s.device, q.qpn, q.dest_qpn,
                 print_set(q.counters));
  }
  return 0;
}

int cmd_version() {
  fmt::print("softrdma {}\n", SOFTRDMA_VERSION);
  // Which libibverbs this process really bound to: the first thing to check when a program
  // behaves like it is on the system library.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ibv_get_device_list), &info) && info.dli_fname)
    fmt::print("libibverbs: {}\n", info.dli_fname);
  fmt::print("lib dir for `softrdma run`: {}\n", lib_dir().string());
  return 0;
}

// Every variable of the configuration table (config/config.h): its value in this environment, its
// default and what it does. markdown: the table docs/debugging.md holds (no values), for
// ctest tools.config_docs.
int cmd_config(bool markdown) {
  if (markdown) {
    fmt::print("| variable | type | default | read by | meaning |\n|---|---|---|---|---|\n");
    for (const config::Variable& v : config::table())
      fmt::print("| `{}` | {} | {} | {} | {} |\n", v.name, config::type_name(v.type),
                 *v.fallback ? fmt::format("`{}`", v.fallback) : std::string("unset"), v.reader, v.help);
    return 0;
  }
  for (const config::Variable& v : config::table()) {
    const char* value = std::getenv(v.name);
    fmt::print("{} {} (default: {})\n    {}, read by {}: {}\n", v.name,
               value ? fmt::format("= {}", value) : std::string("unset"), *v.fallback ? v.fallback : "unset",
               config::type_name(v.type), v.reader, v.help);
  }
  // The one setting that depends on two variables, as every library sees it.
  fmt::print("direct path: {}\n", config::parse().direct ? "on" : "off");
  return 0;
}

}  // namespace
}  // namespace softrdma::tools

int main(int argc, char** argv) {
  using namespace softrdma::tools;
  CLI::App app{"softrdma: RDMA in user space over RoCEv2/UDP"};
  app.require_subcommand(1);

  auto* devices = app.add_subcommand("devices", "List devices, ports, MTUs and GID tables");
  bool verbose = false;
  std::string only_dev, for_ip;
  devices->add_flag("-v,--verbose", verbose, "Also print device and port limits (as ibv_devinfo -v)");
  devices->add_option("-d,--ib-dev", only_dev, "Only this device");
  bool devices_iwarp = false;
  devices->add_flag("--iwarp", devices_iwarp, "List the iWARP devices (SOFTRDMA_TRANSPORT=iwarp; also =both)");
  devices->add_option("--ip", for_ip,
                      "Print only the names of the devices bound to this IPv4 or IPv6 address (for scripts)");

  auto* run = app.add_subcommand("run", "Run PROGRAM ARGS... with softrdma's libraries loaded");
  bool print_env = false, no_view = false, run_iwarp = false;
  run->add_flag("--print-env", print_env, "Print the loader variables set for PROGRAM to stderr");
  run->add_flag("--no-view", no_view,
                "Do not show the devices in /sys/class/infiniband and /dev/infiniband (also SOFTRDMA_VIEW=0)");
  run->add_flag("--iwarp", run_iwarp, "Offer iWARP devices only (softrdma_iw_*; SOFTRDMA_TRANSPORT=iwarp)");
  run->footer("PROGRAM ARGS...: the program to run and its arguments (a leading -- is optional)");

  auto* capture = app.add_subcommand(
      "capture", "Run PROGRAM ARGS... as `run` does, writing its RoCE packets to a pcapng file (-w FILE)");
  std::string capture_file;
  capture->add_option("-w", capture_file, "The pcapng file to write (truncated first)");
  capture->footer("Also takes run's options. PROGRAM ARGS...: the program to run and its arguments (after --)");

  auto* version = app.add_subcommand("version", "Print the version and the library in use");

  auto* stat = app.add_subcommand("stat", "Live counters of the running softrdma processes (as rdma statistic)");
  bool stat_qp = false, stat_all = false;
  stat->add_flag("-q,--qp", stat_qp, "Also print each QP's counters");
  stat->add_flag("-a,--all", stat_all, "Print counters that are zero too");

  auto* config_cmd = app.add_subcommand("config", "List every SOFTRDMA_* variable: its value here, default and help");
  bool config_markdown = false;
  config_cmd->add_flag("--markdown", config_markdown,
                       "Print the table of docs/debugging.md instead (no values)");

  // `run` takes its own few options, then PROGRAM: everything from PROGRAM on is PROGRAM's, which
  // a general option parser would try to interpret, so `run` is split off by hand.
  const bool is_capture = argc >= 2 && std::string_view(argv[1]) == "capture";
  if (argc >= 2 && (std::string_view(argv[1]) == "run" || is_capture)) {
    std::vector<std::string> rest;
    int i = 2;
    for (; i < argc; ++i) {
      std::string_view a = argv[i];
      if (is_capture && a == "-w" && i + 1 < argc) {
        capture_file = argv[++i];
      } else if (a == "--print-env") {
        print_env = true;
      } else if (a == "--no-view") {
        no_view = true;
      } else if (a == "--iwarp") {
        run_iwarp = true;
      } else if (a == "-h" || a == "--help") {
        fmt::print("{}", (is_capture ? capture : run)->help());
        return 0;
      } else if (a == "--") {
        ++i;
        break;
      } else if (!a.empty() && a.front() == '-') {
        fmt::print(stderr, "softrdma {}: unknown option {} (use -- before PROGRAM)\n", argv[1], a);
        return 2;
      } else {
        break;
      }
    }
    for (; i < argc; ++i) rest.emplace_back(argv[i]);
    if (is_capture) return cmd_capture(capture_file, rest, print_env, !no_view, run_iwarp);
    return cmd_run(rest, print_env, !no_view, run_iwarp);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (*devices && devices_iwarp) setenv("SOFTRDMA_TRANSPORT", "iwarp", 1);
  if (*devices) return for_ip.empty() ? cmd_devices(verbose, only_dev) : cmd_devices_for_ip(for_ip);
  if (*version) return cmd_version();
  if (*stat) return cmd_stat(stat_qp, stat_all);
  if (*config_cmd) return cmd_config(config_markdown);
  return 1;
}
