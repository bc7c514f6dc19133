// A packet port: batched UDP I/O for one device context (src/net; docs/architecture.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "config/config.h"
#include "net/packet_port.h"

namespace softrdma::net {

struct PortImpairment;  // net/impairment.h
class Capture;          // net/capture.h
class Liveness;         // net/liveness.h

class UdpPort final : public PacketPort {
 public:
  static constexpr uint32_t kMaxDatagram = 65536;  // bytes per preallocated buffer

  // Port 0 binds a free port in [kContextPortBegin, kContextPortEnd): below the 0xC000 and up that RoCE
  // stacks send from, so that a receiver knows a softrdma context (identification 0) by its source port.
  static constexpr uint16_t kContextPortBegin = 32768, kContextPortEnd = 0xC000;
  static constexpr bool is_context_port(uint16_t port) { return port >= kContextPortBegin && port < kContextPortEnd; }

  // Binds an unconnected, nonblocking UDP socket of the address's family to (ip, port) (port 0: see
  // above; a link-local IPv6 address on the interface that holds it), with DF set (IP_PMTUDISC_DO: the
  // kernel then sends IP identification 0, which the ICRC covers; over IPv6 no fragments), PKTINFO on,
  // UDP_SEGMENT/UDP_GRO where the kernel has them (offload()) and 8 MiB socket buffers where allowed.
  // Throws std::system_error on failure.
  // settings: SOFTRDMA_IMPAIR and SOFTRDMA_GSO, from the environment when the port opens unless given.
  UdpPort(const wire::IpAddress& ip, uint16_t port, const config::Settings& settings = config::parse());
  // Takes fd, a nonblocking UDP socket another port bound and configured (net/port_share.h: a
  // process's duplicate of the host's 4791 socket). Throws std::system_error (closing fd) when its
  // segmentation differs from what settings ask, since received buffers would then be misread.
  struct Adopt {};
  UdpPort(Adopt, int fd, const config::Settings& settings = config::parse());
  ~UdpPort();
  UdpPort(const UdpPort&) = delete;
  UdpPort& operator=(const UdpPort&) = delete;

  int fd() const override { return fd_; }
  uint16_t port() const override { return port_; }  // host order; the actual port when 0 was asked
  const wire::IpAddress& ip() const override { return ip_; }
  // A context port (port 0 asked) also listens on TCP at its number, when that was free.
  Liveness* liveness() override { return liveness_.get(); }

  // Receives up to max (at most kBatch) datagrams with one recvmmsg into the port's own buffers; a
  // buffer that arrived segmented (UDP_GRO) gives one datagram per segment, over as many calls as it
  // takes. out[i].data stays valid until the next receive(). Returns the count (0 if none).
  size_t receive(Datagram* out, size_t max) override;

  // Datagrams go out in batches of up to kBatch messages (sendmmsg); a coalesced run of them to one
  // destination is one message with UDP_SEGMENT (net/gso.h). A datagram longer than kMaxDatagram is
  // refused and counted in tx_errors.
  uint8_t* reserve(uint32_t len, const wire::IpAddress& dst_ip, uint16_t dst_port, bool coalesce,
                   uint16_t* ip_id) override;
  void commit() override;
  // Sends everything queued with sendmmsg, waiting briefly for socket space on EAGAIN/ENOBUFS rather than
  // dropping. Datagrams the kernel rejects (e.g. EMSGSIZE over the path MTU) count in tx_errors.
  void flush() override;
  // Whether this port segments sends and receives segmented buffers (off with SOFTRDMA_GSO=0).
  bool offload() const { return gso_; }
  size_t queued() const override { return tx_count_; }
  void defer_queued() override { deferred_ = tx_count_; }

  struct Stats {
    uint64_t tx_packets, tx_bytes, rx_packets, rx_bytes, tx_errors;
  };
  const Stats& stats() const { return stats_; }
  // Test fault injection (SOFTRDMA_IMPAIR, read when the port is created): nullptr when off. Its tx_stats
  // and rx_stats count every datagram dropped, duplicated, reordered or corrupted.
  const PortImpairment* impairment() const { return impair_.get(); }

 private:
  // SOFTRDMA_IMPAIR's faults (seeded by the port's index in this process) and SOFTRDMA_CAPTURE.
  void open_hooks(const config::Settings& settings);
  void init_buffers();
  size_t receive_raw(Datagram* out, size_t max);
  size_t receive_impaired(Datagram* out, size_t max);
  uint8_t* place(uint32_t len, const wire::IpAddress& dst_ip, uint16_t dst_port, bool coalesce, uint16_t* ip_id);
  void place_commit();
  void enqueue(const uint8_t* data, uint32_t len, const wire::IpAddress& dst_ip, uint16_t dst_port, bool coalesce);
  void send_batch();

  struct Buffers;  // message headers, addresses, control space and packet storage
  int fd_ = -1;
  wire::IpAddress ip_;
  uint32_t scope_id_ = 0;  // the interface of an IPv6 address: sends to link-local peers leave there
  uint16_t port_ = 0;
  bool gso_ = false;
  size_t tx_count_ = 0;  // messages queued (each one datagram or a segmented run)
  size_t deferred_ = 0;  // the first messages queued, to leave after the others (defer_queued)
  // The datagram reserve() placed, until commit(): in slot placing_slot_, opening it when placing_new_.
  size_t placing_slot_ = 0;
  bool placing_new_ = false;
  uint32_t placing_len_ = 0;
  wire::IpAddress placing_ip_;
  uint16_t placing_port_ = 0, placing_id_ = 0;
  uint8_t* placing_at_ = nullptr;
  bool placing_coalesce_ = false;
  // Receive side: slots filled by the last recvmmsg, and the one being split into its segments.
  size_t rx_got_ = 0, rx_next_ = 0;
  Stats stats_{};
  std::unique_ptr<Buffers> buf_;
  std::unique_ptr<PortImpairment> impair_;
  std::shared_ptr<Capture> capture_;  // SOFTRDMA_CAPTURE; nullptr when off
  std::unique_ptr<Liveness> liveness_;
};

// Whether some socket of this network namespace is bound to UDP `port` (any local address), read from
// /proc rather than by a test bind, which would make the owner's own bind fail if it came at that
// instant. True when /proc cannot be read.
bool udp_port_bound(uint16_t port);

}  // namespace softrdma::net
