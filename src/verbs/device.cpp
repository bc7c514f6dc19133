// Devices, contexts and their queries: one softrdma device per IPv4 address and per global IPv6 address of the host (docs/architecture.md, "Devices and addressing").
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string_view>

#include "config/config.h"
#include "core/limits.h"
#include "net/udp_port.h"
#include "verbs/parent_domain.h"
#include "verbs/private_abi.h"
#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace softrdma::verbs {

namespace {

// SOFTRDMA_TRANSPORT: roce (default: RoCE devices only), iwarp (iWARP devices only, as a siw host),
// both (RoCE devices first, then iWARP). Anything else counts as roce.
using Selection = config::Transport;

Selection selection() { return config::parse().transport; }

// EUI-64 from a MAC (the universal/local bit flipped), as RoCE NICs and siw (addrconf_addr_eui48) do.
uint64_t eui64(const std::array<uint8_t, 6>& m) {
  return (uint64_t{static_cast<uint8_t>(m[0] ^ 2)} << 56) | (uint64_t{m[1]} << 48) | (uint64_t{m[2]} << 40) |
         (0xFFull << 32) | (0xFEull << 24) | (uint64_t{m[3]} << 16) | (uint64_t{m[4]} << 8) | m[5];
}

SoftDevice* make_device(const net::Interface& itf, int index, bool iwarp) {
  auto* d = new SoftDevice{};
  d->iface = itf;
  d->index = index;
  d->iwarp = iwarp;
  d->dev.node_type = iwarp ? IBV_NODE_RNIC : IBV_NODE_CA;
  d->dev.transport_type = iwarp ? IBV_TRANSPORT_IWARP : IBV_TRANSPORT_IB;
  // A device on an IPv6 address is softrdma6_<ifname>, or softrdma_iw6_<ifname> (the interface's IPv4
  // device keeps the plain name).
  const bool v4 = itf.ip.is_v4();
  const char* form = iwarp ? (v4 ? "softrdma_iw_%s" : "softrdma_iw6_%s") : v4 ? "softrdma_%s" : "softrdma6_%s";
  snprintf(d->dev.name, sizeof d->dev.name, form, itf.ifname.c_str());
  snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%d", index);
  snprintf(d->dev.dev_path, sizeof d->dev.dev_path, "/sys/class/infiniband_verbs/uverbs%d", index);
  snprintf(d->dev.ibdev_path, sizeof d->dev.ibdev_path, "/sys/class/infiniband/%s", d->dev.name);
  bool has_mac = false;
  for (uint8_t b : itf.mac) has_mac |= b != 0;
  // An iWARP device takes its GUID from the MAC as siw does, a zero MAC included (loopback); a RoCE
  // device without a MAC uses its address (an IPv6 one by its key). An IPv6 device's GUID has 6 in
  // bits 32-35, so that it differs from the IPv4 device of the same interface.
  uint64_t guid = has_mac || iwarp ? eui64(itf.mac) : (0x02ull << 56) | ntohl(itf.ip.key());
  if (!itf.ip.is_v4()) guid ^= 0x6ull << 32;
  d->guid_be = htobe64(guid);
  return d;
}

const std::vector<SoftDevice*>* lists[3];
std::once_flag list_once[3];

// Each selection's list is enumerated once per process and never freed: applications may keep
// ibv_device pointers forever.
const std::vector<SoftDevice*>& devices_of(Selection sel) {
  const int k = static_cast<int>(sel);
  std::call_once(list_once[k], [sel, k] {
    auto* out = new std::vector<SoftDevice*>;
    const std::vector<net::Interface> itfs = net::list_interfaces();
    int i = 0;
    if (sel != Selection::Iwarp)
      for (const net::Interface& itf : itfs) out->push_back(make_device(itf, i++, false));
    // One iWARP device per RoCE device, in the same order: its TCP connections run over that address.
    if (sel != Selection::Roce)
      for (const net::Interface& itf : itfs) out->push_back(make_device(itf, i++, true));
    lists[k] = out;
  });
  return *lists[k];
}

}  // namespace

const std::vector<SoftDevice*>& all_devices() { return devices_of(selection()); }

namespace {
constexpr uint32_t kGidTblLen = 16;

ibv_mtu ib_mtu_for(uint32_t netdev_mtu, bool v6) {
  // Largest IBTA MTU whose packets (IP + UDP + BTH + the largest extension headers + ICRC) fit.
  const uint32_t overhead = (v6 ? 40 : 20) + 8 + 12 + 28 + 4;
  for (int m = IBV_MTU_4096; m > IBV_MTU_256; --m)
    if (core::mtu_bytes(m) + overhead <= netdev_mtu) return static_cast<ibv_mtu>(m);
  return IBV_MTU_256;
}

ibv_gid gid_of(const SoftDevice& d) {
  ibv_gid g{};
  if (d.iwarp) {
    // As siw: the interface's MAC in the first six bytes, the rest zero (loopback: all zero).
    std::memcpy(g.raw, d.iface.mac.data(), d.iface.mac.size());
    return g;
  }
  // RoCE v2: the address itself, IPv4 as ::ffff:a.b.c.d.
  std::memcpy(g.raw, d.iface.ip.bytes.data(), 16);
  return g;
}

void fill_device_attr(const SoftDevice& d, ibv_device_attr& a) {
  using L = core::DeviceLimits;
  std::memset(&a, 0, sizeof a);
  snprintf(a.fw_ver, sizeof a.fw_ver, "softrdma-0.1");
  a.node_guid = d.guid_be;
  a.sys_image_guid = d.guid_be;
  a.max_mr_size = L::kMaxMrSize;
  a.page_size_cap = 0xFFFFF000;  // any power-of-two page size from 4 KiB
  a.vendor_id = L::kVendorId;
  a.vendor_part_id = L::kVendorPartId;
  a.hw_ver = L::kHwVer;
  a.max_qp = L::kMaxQp;
  a.max_qp_wr = L::kMaxQpWr;
  a.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_PORT_ACTIVE_EVENT |
                       IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B |
                       IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_XRC;
  a.device_cap_flags |= IBV_DEVICE_RAW_IP_CSUM;  // raw packet QPs' IBV_SEND_IP_CSUM (raw.cpp)
  a.max_raw_ethy_qp = L::kMaxQp;
  a.max_sge = L::kMaxSge;
  a.max_sge_rd = L::kMaxSge;
  a.max_cq = L::kMaxCq;
  a.max_cqe = L::kMaxCqe;
  a.max_mr = L::kMaxMr;
  a.max_pd = L::kMaxPd;
  a.max_mw = core::MrTable::kMaxMw;
  a.max_srq = L::kMaxSrq;
  a.max_srq_wr = L::kMaxSrqWr;
  a.max_srq_sge = L::kMaxSrqSge;
  a.max_qp_rd_atom = L::kMaxQpRdAtom;
  a.max_qp_init_rd_atom = L::kMaxQpRdAtom;
  a.max_res_rd_atom = L::kMaxQpRdAtom * L::kMaxQp;
  a.atomic_cap = IBV_ATOMIC_HCA;
  a.max_pkeys = 1;
  a.max_mcast_grp = L::kMaxMcastGrp;
  a.max_mcast_qp_attach = L::kMaxMcastQpAttach;
  a.max_total_mcast_qp_attach = L::kMaxMcastGrp * L::kMaxMcastQpAttach;
  a.local_ca_ack_delay = 15;
  a.phys_port_cnt = 1;
  if (d.iwarp) {
    // As siw presents an RNIC (siw_query_device): no atomics, one READ sink SGE, no memory windows,
    // multicast, XRC or raw packet QPs; device_cap_flags are siw's. What stays ours is what we are:
    // our vendor id, firmware string and object limits (docs/iwarp.md).
    a.device_cap_flags = IBV_DEVICE_MEM_MGT_EXTENSIONS;
    a.atomic_cap = IBV_ATOMIC_NONE;
    a.max_sge_rd = 1;
    a.max_mw = 0;
    a.max_raw_ethy_qp = 0;
    a.max_mcast_grp = a.max_mcast_qp_attach = a.max_total_mcast_qp_attach = 0;
    a.local_ca_ack_delay = 0;
    a.page_size_cap = 4096;  // siw: PAGE_SIZE
  }
}

// Largest IBTA MTU not above the interface's, as siw's ib_mtu_int_to_enum (TCP carries the FPDUs:
// no packet overhead to subtract).
ibv_mtu iwarp_mtu_for(uint32_t netdev_mtu) {
  for (int m = IBV_MTU_4096; m > IBV_MTU_256; --m)
    if (core::mtu_bytes(m) <= netdev_mtu) return static_cast<ibv_mtu>(m);
  return IBV_MTU_256;
}
}  // namespace

ibv_mtu iwarp_rc_path_mtu(ibv_context* ctx) {
  // The direct-path attach runs the RC machinery, whose packets (if any) must fit a UDP datagram.
  const SoftDevice& d = *to_ctx(ctx)->device;
  return std::min(ib_mtu_for(d.iface.mtu, !d.iface.ip.is_v4()), iwarp_mtu_for(d.iface.mtu));
}

int query_port_ex(ibv_context* ctx, uint8_t port, ibv_port_attr* out, size_t size) {
  if (port != 1) return EINVAL;
  const SoftDevice& d = *to_ctx(ctx)->device;
  const net::LinkState link = to_ctx(ctx)->engine->port_link();
  ibv_port_attr a{};
  // The port follows its interface as a RoCE port follows its netdev: Disabled while it is down,
  // Polling while up without carrier (no peer), LinkUp otherwise.
  a.state = link.active() ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a.max_mtu = a.active_mtu = ib_mtu_for(d.iface.mtu, !d.iface.ip.is_v4());
  // Index 0 holds the interface's GID; the others are empty slots, as on a RoCE port whose netdev
  // has fewer addresses than its table has entries (they read back as ENODATA).
  a.gid_tbl_len = kGidTblLen;
  a.max_msg_sz = core::DeviceLimits::kMaxMsgSize;
  a.pkey_tbl_len = 1;
  a.max_vl_num = 1;
  a.active_width = 2;    // 4X
  a.active_speed = 32;   // EDR: nominal; a software port has no signalling rate
  a.phys_state = !link.admin_up ? 3 : !link.carrier ? 2 : 5;  // Disabled, Polling, LinkUp
  a.link_layer = IBV_LINK_LAYER_ETHERNET;
  if (d.iwarp) {
    // As siw_query_port: one GID, CM and device management supported, no VLs; P_Key table of one
    // entry (siw has none; ours keeps ibv_query_pkey and INIT's pkey_index meaningful).
    a.max_mtu = a.active_mtu = iwarp_mtu_for(d.iface.mtu);
    a.gid_tbl_len = 1;
    a.port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP;
    a.max_vl_num = 0;
  }
  std::memcpy(out, &a, std::min(size, sizeof a));
  return 0;
}

int query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input* in, ibv_device_attr_ex* attr,
                    size_t size) {
  if (in && in->comp_mask) return EINVAL;
  // Callers built against an older verbs.h pass a shorter struct: they get the fields they know.
  if (size < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex a{};
  fill_device_attr(*to_ctx(ctx)->device, a.orig_attr);
  // The extended flags are a superset of the classic ones. Above bit 31 only RDMA ATOMIC WRITE applies
  // (the kernel's IB_UVERBS_DEVICE_ATOMIC_WRITE, bit 40, which the v44 verbs.h does not name); no
  // scatter-FCS, no end padding...
  constexpr uint64_t kDeviceAtomicWrite = uint64_t{1} << 40;
  a.device_cap_flags_ex = a.orig_attr.device_cap_flags | kDeviceAtomicWrite;
  // Completion timestamps count CompletionQueue::clock_ns(): 64 valid bits at 1 GHz (in kHz here).
  a.completion_timestamp_mask = ~uint64_t{0};
  a.hca_core_clock = 1000000;
  // On-demand paging, explicit and implicit (mr_cq.cpp): every access of every transport faults the
  // pages of an ODP region in (core::fault_in).
  a.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
  constexpr uint32_t kOdpRecv = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
  a.odp_caps.per_transport_caps.rc_odp_caps =
      kOdpRecv | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC;
  a.odp_caps.per_transport_caps.uc_odp_caps = kOdpRecv | IBV_ODP_SUPPORT_WRITE;
  a.odp_caps.per_transport_caps.ud_odp_caps = kOdpRecv;
  a.xrc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_SRQ_RECV | IBV_ODP_SUPPORT_WRITE |
                  IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC;
  // Raw packet QPs: RSS over WQs, IP checksums (raw.cpp). Everything else is zero because it does not
  // exist here: TSO, packet pacing, VLAN stripping, scatter FCS, CQ moderation, PCIe
  // atomics.
  fill_raw_caps(a);
  a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
  a.max_dm_size = kMaxDmSize;  // device memory: host memory of the context's process (dm.cpp)
  a.tm_caps = tm_caps();  // tag-matching SRQs (tm.cpp)
  if (to_ctx(ctx)->device->iwarp) {
    // siw has none of these: no ATOMIC WRITE, ODP, raw packet QPs, device memory, tag matching.
    ibv_device_attr_ex x{};
    x.orig_attr = a.orig_attr;
    x.device_cap_flags_ex = a.orig_attr.device_cap_flags;
    x.completion_timestamp_mask = a.completion_timestamp_mask;
    x.hca_core_clock = a.hca_core_clock;
    x.phys_port_cnt_ex = a.phys_port_cnt_ex;
    a = x;
  }
  std::memcpy(attr, &a, std::min(size, sizeof a));
  return 0;
}

}  // namespace softrdma::verbs

SOFTRDMA_EXPORT ibv_device** ibv_get_device_list(int* num) {
  const auto& devs = all_devices();
  auto** list = static_cast<ibv_device**>(calloc(devs.size() + 1, sizeof(ibv_device*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < devs.size(); ++i) list[i] = &devs[i]->dev;
  if (num) *num = static_cast<int>(devs.size());
  return list;
}

SOFTRDMA_EXPORT void ibv_free_device_list(ibv_device** list) { free(list); }

SOFTRDMA_EXPORT const char* ibv_get_device_name(ibv_device* dev) { return dev ? dev->name : nullptr; }

SOFTRDMA_EXPORT __be64 ibv_get_device_guid(ibv_device* dev) {
  return reinterpret_cast<SoftDevice*>(dev)->guid_be;
}

SOFTRDMA_EXPORT int ibv_get_device_index(ibv_device* dev) { return reinterpret_cast<SoftDevice*>(dev)->index; }

namespace softrdma::verbs {

ibv_context* make_context(std::shared_ptr<ContextShared> shared, int cmd_fd) {
  auto* c = new (std::nothrow) SoftContext(std::move(shared));
  if (!c) {
    errno = ENOMEM;
    return nullptr;
  }
  verbs_context& v = c->vctx;
  v.sz = sizeof(verbs_context);
  v.query_port = query_port_ex;
  v.query_device_ex = query_device_ex;
  v.create_cq_ex = create_cq_ex;
  v.query_rt_values = query_rt_values;
  v.create_qp_ex = create_qp_ex;
  v.create_srq_ex = create_srq_ex;
  v.advise_mr = advise_mr;
  v.alloc_dm = alloc_dm;
  v.free_dm = free_dm;
  v.reg_dm_mr = reg_dm_mr;
  v.open_xrcd = open_xrcd;
  v.close_xrcd = close_xrcd;
  v.get_srq_num = get_srq_num;
  v.open_qp = open_qp;
  v.alloc_td = alloc_td;
  v.dealloc_td = dealloc_td;
  v.alloc_parent_domain = alloc_parent_domain;
  install_raw_ops(v);
  v.post_srq_ops = post_srq_ops;
  ibv_context& ctx = v.context;
  ctx.device = &c->device->dev;
  ctx.ops.poll_cq = poll_cq;
  ctx.ops.req_notify_cq = req_notify_cq;
  ctx.ops.post_send = post_send;
  ctx.ops.post_recv = post_recv;
  ctx.ops.alloc_mw = alloc_mw;
  ctx.ops.dealloc_mw = dealloc_mw;
  ctx.ops.bind_mw = bind_mw;
  ctx.ops.post_srq_recv = post_srq_recv;
  ctx.cmd_fd = cmd_fd;
  ctx.async_fd = c->engine->async_events().fd();
  ctx.num_comp_vectors = 1;
  pthread_mutex_init(&ctx.mutex, nullptr);
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  if (c->device->iwarp) {
    // What a siw context lacks: its verbs.h wrappers then fail with EOPNOTSUPP, as over siw (memory
    // windows, XRC, device memory, raw packet flows/WQs/RSS, ODP advice, XRC/tag-matching SRQs).
    ctx.ops.alloc_mw = nullptr;
    ctx.ops.dealloc_mw = nullptr;
    ctx.ops.bind_mw = nullptr;
    v.open_xrcd = nullptr;
    v.close_xrcd = nullptr;
    v.get_srq_num = nullptr;
    v.open_qp = nullptr;
    v.alloc_dm = nullptr;
    v.free_dm = nullptr;
    v.reg_dm_mr = nullptr;
    v.advise_mr = nullptr;
    v.create_srq_ex = nullptr;
    v.post_srq_ops = nullptr;
    v.ibv_create_flow = nullptr;
    v.ibv_destroy_flow = nullptr;
    v.create_wq = nullptr;
    v.modify_wq = nullptr;
    v.destroy_wq = nullptr;
    v.create_rwq_ind_table = nullptr;
    v.destroy_rwq_ind_table = nullptr;
  }
  return &ctx;
}

}  // namespace softrdma::verbs

namespace {

// A context's settings are read when it opens and kept: its engine's options, and its UDP ports,
// the RoCE port included when the context takes it over later.
ibv_context* open_context(SoftDevice* sd, const config::Settings& settings, uint32_t flags) {
  transport::EngineOptions opts = transport::context_options(settings);
  if (flags & SOFTRDMA_OPEN_PACKETS) opts.direct = false;
  opts.open_port = [settings](const wire::IpAddress& ip, uint16_t port) -> std::unique_ptr<net::PacketPort> {
    return std::make_unique<net::UdpPort>(ip, port, settings);
  };
  opts.adopt_port = [settings](int fd) -> std::unique_ptr<net::PacketPort> {
    return std::make_unique<net::UdpPort>(net::UdpPort::Adopt{}, fd, settings);
  };
  std::shared_ptr<ContextShared> shared;
  try {
    shared = std::make_shared<ContextShared>();
    shared->device = sd;
    shared->engine = std::make_unique<transport::Engine>(sd->iface, std::move(opts));
  } catch (const std::system_error& e) {
    errno = e.code().value() ? e.code().value() : ENODEV;
    return nullptr;
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
    return nullptr;
  }
  // The command fd names the context's object space, as the uverbs file does (import.cpp).
  int fd = open_command_fd(shared);
  if (fd < 0) return nullptr;
  ibv_context* ctx = make_context(std::move(shared), fd);
  if (!ctx) close(fd);
  return ctx;
}

// The variables a context reads when it opens and keeps (EngineOptions, its UDP ports): those
// softrdma_open_device_with takes (private_abi.h). The others are read by the process (the device
// list, the registry, librdmacm).
constexpr std::string_view kContextVariables[] = {"SOFTRDMA_DIRECT", "SOFTRDMA_IMPAIR", "SOFTRDMA_SPIN_US",
                                                  "SOFTRDMA_GSO", "SOFTRDMA_COUNTERS", "SOFTRDMA_DIRECT_PEERS",
                                                  "SOFTRDMA_STATS_MODE", "SOFTRDMA_PEER_PAUSE_MS"};

bool context_variable(std::string_view name) {
  for (std::string_view v : kContextVariables)
    if (v == name) return true;
  return false;
}

}  // namespace

SOFTRDMA_EXPORT ibv_context* ibv_open_device(ibv_device* dev) {
  // The context's settings are read now: a process may open contexts with different ones.
  return open_context(reinterpret_cast<SoftDevice*>(dev), config::parse(), 0);
}

// Any device of ours, RoCE or iWARP, whatever SOFTRDMA_TRANSPORT selects, with settings of its own
// over the process's (private_abi.h).
SOFTRDMA_EXPORT ibv_context* softrdma_open_device_with(const char* name, uint32_t flags, const char* settings) {
  std::optional<config::Assignments> own = config::parse_assignments(settings ? settings : "");
  bool ok = name && !(flags & ~uint32_t{SOFTRDMA_OPEN_PACKETS}) && own;
  for (size_t i = 0; ok && i < own->size(); ++i) ok = context_variable((*own)[i].first);
  if (!ok) {
    errno = EINVAL;
    return nullptr;
  }
  for (int k = 0; k < 3; ++k)
    for (SoftDevice* sd : devices_of(static_cast<Selection>(k)))
      if (!strcmp(sd->dev.name, name)) return open_context(sd, config::parse(*own), flags);
  errno = ENODEV;
  return nullptr;
}

// The table's settings (SOFTRDMA_DIRECT included), and packets only when the caller asks.
SOFTRDMA_EXPORT ibv_context* softrdma_open_device(const char* name, uint32_t flags) {
  return softrdma_open_device_with(name, flags, nullptr);
}

// The process's setting of a variable, over the environment (private_abi.h).
SOFTRDMA_EXPORT int softrdma_set_option(const char* name, const char* value) {
  return name && config::set_option(name, value) ? 0 : EINVAL;
}

SOFTRDMA_EXPORT void softrdma_flush_held_acks() { transport::Engine::flush_all_held(); }

SOFTRDMA_EXPORT int ibv_close_device(ibv_context* ctx) {
  SoftContext* c = to_ctx(ctx);
  if (ctx->cmd_fd >= 0) close(ctx->cmd_fd);
  pthread_mutex_destroy(&ctx->mutex);
  delete c;
  return 0;
}

SOFTRDMA_EXPORT int ibv_query_device(ibv_context* ctx, ibv_device_attr* attr) {
  fill_device_attr(*to_ctx(ctx)->device, *attr);
  return 0;
}

#undef ibv_query_port
SOFTRDMA_EXPORT int ibv_query_port(ibv_context* ctx, uint8_t port, _compat_ibv_port_attr* attr) {
  return query_port_ex(ctx, port, reinterpret_cast<ibv_port_attr*>(attr), offsetof(ibv_port_attr, flags));  // the layout before flags were added
}

// As rdma-core over the kernel: an index past the table is EINVAL, an empty slot reads as a zero GID.
namespace {
uint32_t gid_tbl_len(ibv_context* ctx) { return to_ctx(ctx)->device->iwarp ? 1 : kGidTblLen; }
}  // namespace

SOFTRDMA_EXPORT int ibv_query_gid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  if (port != 1 || index < 0 || static_cast<uint32_t>(index) >= gid_tbl_len(ctx)) {
    errno = EINVAL;
    return -1;
  }
  *gid = index == 0 ? gid_of(*to_ctx(ctx)->device) : ibv_gid{};
  return 0;
}

SOFTRDMA_EXPORT int _ibv_query_gid_ex(ibv_context* ctx, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                                      uint32_t flags, size_t entry_size) {
  if (flags) return EINVAL;
  if (port != 1 || index >= gid_tbl_len(ctx)) return EINVAL;
  if (index != 0) return ENODATA;  // an empty slot
  const SoftDevice& d = *to_ctx(ctx)->device;
  ibv_gid_entry e{};
  e.gid = gid_of(d);
  e.gid_index = 0;
  e.port_num = 1;
  // An iWARP port's GID is of type IB, as the kernel's GID cache gives siw (not RoCE).
  e.gid_type = d.iwarp ? IBV_GID_TYPE_IB : IBV_GID_TYPE_ROCE_V2;
  e.ndev_ifindex = static_cast<uint32_t>(d.iface.ifindex);
  std::memcpy(entry, &e, std::min(entry_size, sizeof e));
  return 0;
}

SOFTRDMA_EXPORT ssize_t _ibv_query_gid_table(ibv_context* ctx, ibv_gid_entry* entries, size_t max_entries,
                                             uint32_t flags, size_t entry_size) {
  if (flags) return -EINVAL;
  if (max_entries < 1) return -EINVAL;
  int rc = _ibv_query_gid_ex(ctx, 1, 0, entries, 0, entry_size);
  return rc ? -rc : 1;
}

// rdma-core's private ABI (driver.h): 0 = IB/RoCE v1, 1 = RoCE v2; an empty slot reads as 0.
SOFTRDMA_EXPORT int ibv_query_gid_type(ibv_context* ctx, uint8_t port, unsigned int index, int* type) {
  if (port != 1 || index >= gid_tbl_len(ctx)) {
    errno = EINVAL;
    return -1;
  }
  *type = index == 0 && !is_iwarp(ctx) ? 1 : 0;
  return 0;
}

SOFTRDMA_EXPORT int ibv_query_pkey(ibv_context* ctx, uint8_t port, int index, __be16* pkey) {
  (void)ctx;
  if (port != 1 || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htons(0xFFFF);
  return 0;
}

SOFTRDMA_EXPORT int ibv_get_pkey_index(ibv_context* ctx, uint8_t port, __be16 pkey) {
  (void)ctx;
  if (port != 1) return -1;
  return (ntohs(pkey) & 0x7FFF) == 0x7FFF ? 0 : -1;
}

SOFTRDMA_EXPORT const char* ibv_get_sysfs_path(void) { return "/sys"; }

// There is no kernel device: the few files programs read from sysfs are answered here.
SOFTRDMA_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  // A device of any selection: its ibv_device may outlive a change of SOFTRDMA_TRANSPORT.
  std::vector<SoftDevice*> every;
  for (Selection s : {Selection::Roce, Selection::Iwarp, Selection::Both})
    every.insert(every.end(), devices_of(s).begin(), devices_of(s).end());
  for (SoftDevice* d : every) {
    if (strcmp(dir, d->dev.ibdev_path) != 0) continue;
    const char* value = nullptr;
    char tmp[64];
    if (!strcmp(file, "node_type")) {
      value = d->iwarp ? "4: RNIC" : "1: CA";
    } else if (!strcmp(file, "fw_ver")) {
      value = "softrdma-0.1";
    } else if (!strcmp(file, "node_desc")) {
      snprintf(tmp, sizeof tmp, "softrdma %s", d->iface.ifname.c_str());
      value = tmp;
    }
    if (!value) break;
    int n = snprintf(buf, size, "%s", value);
    return n;
  }
  errno = ENOENT;
  return -1;
}

SOFTRDMA_EXPORT int ibv_get_async_event(ibv_context* ctx, ibv_async_event* event) {
  transport::AsyncEvent e;
  if (to_ctx(ctx)->engine->async_events().pop(e) != 0) return -1;
  std::memset(event, 0, sizeof *event);
  event->event_type = static_cast<ibv_event_type>(e.type);
  if (e.qp)
    event->element.qp = &static_cast<SoftQp*>(e.qp->user)->qpx.qp_base;
  else if (e.srq)
    event->element.srq = static_cast<ibv_srq*>(e.srq->user);
  else if (e.cq)
    event->element.cq = reinterpret_cast<ibv_cq*>(static_cast<SoftCq*>(e.cq->user));
  else
    event->element.port_num = 1;
  return 0;
}

SOFTRDMA_EXPORT void ibv_ack_async_event(ibv_async_event* event) {
  switch (event->event_type) {
    case IBV_EVENT_CQ_ERR: {
      ibv_cq* cq = event->element.cq;
      pthread_mutex_lock(&cq->mutex);
      ++cq->async_events_completed;
      pthread_cond_signal(&cq->cond);
      pthread_mutex_unlock(&cq->mutex);
      break;
    }
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED: {
      ibv_qp* qp = event->element.qp;
      pthread_mutex_lock(&qp->mutex);
      ++qp->events_completed;
      pthread_cond_signal(&qp->cond);
      pthread_mutex_unlock(&qp->mutex);
      break;
    }
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED: {
      ibv_srq* srq = event->element.srq;
      pthread_mutex_lock(&srq->mutex);
      ++srq->events_completed;
      pthread_cond_signal(&srq->cond);
      pthread_mutex_unlock(&srq->mutex);
      break;
    }
    default:
      break;
  }
}

SOFTRDMA_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  if (!take_slot(to_ctx(ctx)->pds, core::DeviceLimits::kMaxPd)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* p = new (std::nothrow) SoftPd{};
  if (!p) {
    --to_ctx(ctx)->pds;
    errno = ENOMEM;
    return nullptr;
  }
  p->pd.context = ctx;
  p->pd.handle = to_ctx(ctx)->next_handle.fetch_add(1);
  ContextShared& sh = *to_ctx(ctx)->shared;
  try {
    std::lock_guard lock(sh.mu);
    sh.pds_by_handle[p->pd.handle] = p;
  } catch (const std::bad_alloc&) {
    --to_ctx(ctx)->pds;
    delete p;
    errno = ENOMEM;
    return nullptr;
  }
  return &p->pd;
}

// Destroys the PD object, through the original or an import of it (ibv_import_pd(3)), and gives that
// struct back; the original's memory stays while any struct refers to it.
SOFTRDMA_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  if (is_parent_domain(pd)) return dealloc_parent_domain(pd);
  auto* self = reinterpret_cast<SoftPd*>(pd);
  SoftPd* o = to_pd(pd);
  ContextShared& sh = *to_ctx(pd->context)->shared;
  std::lock_guard lock(sh.mu);
  if (o->destroyed) return EINVAL;  // an import of a PD already deallocated: only unimport is left
  if (o->users.load()) return EBUSY;
  o->destroyed = true;
  sh.pds_by_handle.erase(o->pd.handle);
  --sh.pds;
  if (self != o) {
    --o->imports;
    delete self;
  } else {
    o->released = true;
  }
  if (o->imports == 0 && o->released) delete o;
  return 0;
}
