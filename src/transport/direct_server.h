// The target's server thread for the direct path (docs/direct-path.md, "Exchange"; docs/security.md,
// "Local isolation"): it accepts initiators on the abstract Unix socket named by our address, closes at
// once those whose user DirectGate refuses, and answers each request (direct_protocol.h) with what
// DirectGate admits and DirectTarget publishes: the arena and writable area (kHello), a QP's descriptor
// (kQpDesc), a share's fd (kMap), a wake-up pipe (kWake); kRing rings the engine. It blocks in poll: an
// idle target costs nothing, and data never comes here.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "core/mr.h"
#include "transport/direct_gate.h"
#include "transport/direct_protocol.h"
#include "transport/direct_target.h"

namespace softrdma::transport {

class DirectServer {
 public:
  // Serves the context at (address key, port: direct_protocol.h). doorbell_fd: the engine's eventfd, written for kRing.
  // Throws std::system_error when the socket cannot be had.
  DirectServer(DirectGate& gate, DirectTarget& target, const core::MrTable& keys, uint32_t ip_key, uint16_t port,
               int doorbell_fd);
  ~DirectServer();
  DirectServer(const DirectServer&) = delete;
  DirectServer& operator=(const DirectServer&) = delete;

 private:
  // One client of the server thread: its credentials and the QP connections it proved.
  struct Client {
    int fd;
    int32_t slot;  // its busy slot; -1 until a kHello was admitted
    int32_t pid;
    uid_t uid;
    DirectGate::Conns descs;  // our QPs connected to it
  };
  static constexpr size_t kMaxClients = 4096;
  static constexpr size_t kMaxIdlePerUid = 64;  // connections of one user not (yet) admitted

  void serve();
  void accept_client();
  // Reads one request of client k and answers it; closes the client when it went.
  void read_client(size_t k);
  void handle(Client& c, const direct::Request& req);
  void on_hello(Client& c, const direct::Request& req);
  void on_qp_desc(Client& c, const direct::Request& req);
  void on_wake(Client& c, const direct::Request& req);
  void on_map(Client& c, const direct::Request& req);
  // A reply with status err and nothing else; counted unless EAGAIN.
  void refuse(const Client& c, int err);

  DirectGate& gate_;
  DirectTarget& target_;
  const core::MrTable& keys_;
  int doorbell_fd_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
  std::vector<Client> clients_;  // server thread only
};

}  // namespace softrdma::transport
