// A raw Ethernet port on one interface (AF_PACKET, SOCK_RAW): what a RAW_PACKET QP sends whole frames
// through and receives the frames its flows steer to it from. Opening one needs CAP_NET_RAW, as a
// kernel RAW_PACKET QP does. It receives nothing until set_rules() gives it rules; the kernel filter
// (frame_filter.h) keeps every other frame of the interface out of the process.
#pragma once
#include <cstdint>
#include <vector>

#include "net/frame_filter.h"

namespace softrdma::net {

class RawPort {
 public:
  // Throws std::system_error (EPERM without CAP_NET_RAW, ENODEV for an unknown interface).
  // Frames sent on the interface by other sockets of the host are received too, as a NIC loops a
  // port's frames back to its other QPs: on loopback as they come back in, on any other interface
  // as they go out.
  RawPort(int ifindex, bool loopback);
  ~RawPort();
  RawPort(const RawPort&) = delete;
  RawPort& operator=(const RawPort&) = delete;

  int fd() const { return fd_; }
  // Sends one frame (destination MAC first) as it is; 0 or an errno.
  int send(const uint8_t* frame, uint32_t len);
  // The frames to receive from now on: those some rule matches (none when rules is empty). 0 or an errno.
  int set_rules(const std::vector<FrameRule>& rules);
  // The next received frame that some rule matches, or nullptr when none is waiting. The view stays
  // valid until the next call. A frame that the kernel let through and the rules refuse is counted in
  // *filtered and skipped. Frames that had an 802.1Q tag carry it in the view's vlan_tci.
  const FrameView* receive(uint64_t* filtered);
  // The frame as it was on the wire (its 802.1Q tag put back after the MAC addresses), into dst of
  // room bytes; returns its length (which may exceed room: nothing is copied then).
  static uint32_t wire_frame(const FrameView& f, uint8_t* dst, uint32_t room);
  static uint32_t wire_length(const FrameView& f) { return f.len + (f.has_vlan ? 4 : 0); }

 private:
  int fd_ = -1;
  int ifindex_;
  bool loopback_;
  bool bound_rx_ = false;
  std::vector<FrameRule> rules_;
  std::vector<uint8_t> buf_;
  FrameView view_;
};

}  // namespace softrdma::net
