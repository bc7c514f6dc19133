/* softrdma's private ABI between its librdmacm.so.1 and libibverbs.so.1, and for its own tests (version
 * node SOFTRDMA_PRIVATE_1; not for applications). librdmacm's iWARP path runs TCP connect/accept and the
 * MPA exchange itself, then hands the connected socket to the QP (docs/iwarp.md). The tests open the
 * device and path they want and give settings without the environment (softrdma_open_device_with,
 * softrdma_set_option). */
#ifndef SOFTRDMA_PRIVATE_ABI_H
#define SOFTRDMA_PRIVATE_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibv_qp;
struct ibv_device;

enum softrdma_iwarp_flags {
  SOFTRDMA_IW_CRC = 1 << 0,        /* MPA CRC in use (both directions) */
  SOFTRDMA_IW_MARKERS_RX = 1 << 1, /* the peer inserts markers in what we receive */
  SOFTRDMA_IW_MARKERS_TX = 1 << 2, /* we insert markers in what we send */
  SOFTRDMA_IW_AWAIT_GRACE = 1 << 3, /* RTR_AWAIT without peer-to-peer: also start after a grace */
  SOFTRDMA_IW_RTR_HOLD = 1 << 4,    /* initiator: the RTR leaves a short hold after the MPA reply */
};

/* The first FPDU rule after the MPA exchange (RFC 5044 §7.1.5, RFC 6581). */
enum softrdma_iwarp_rtr {
  SOFTRDMA_IW_RTR_NONE = 0,        /* initiator without peer-to-peer: the ULP sends first */
  SOFTRDMA_IW_RTR_SEND_WRITE = 1,  /* initiator: send a zero-length RDMA WRITE first */
  SOFTRDMA_IW_RTR_SEND_READ = 2,   /* initiator: send a zero-length RDMA READ first */
  SOFTRDMA_IW_RTR_SEND_SEND = 3,   /* initiator: send a zero-length SEND first */
  SOFTRDMA_IW_RTR_AWAIT = 4,       /* responder, no RTR agreed: send nothing until the first FPDU */
  /* responder with peer-to-peer: send nothing until the agreed zero-length RTR, refuse any other */
  SOFTRDMA_IW_RTR_AWAIT_WRITE = 5,
  SOFTRDMA_IW_RTR_AWAIT_READ = 6,
  SOFTRDMA_IW_RTR_AWAIT_SEND = 7,
};

struct softrdma_iwarp_conn {
  int fd;            /* connected TCP socket, MPA frames exchanged; libibverbs dup()s what it keeps */
  uint32_t flags;    /* softrdma_iwarp_flags */
  uint32_t rtr;      /* softrdma_iwarp_rtr */
  uint32_t ird, ord; /* negotiated: READs the peer may have outstanding at us / we at the peer */
  uint32_t peer_qpn; /* a softrdma QP of this host at the other end (the direct path), 0 if none */
};

/* Moves an RC QP of an iWARP device (INIT) to RTS over the connection. 0 or an errno. */
int softrdma_iwarp_attach(struct ibv_qp *qp, const struct softrdma_iwarp_conn *conn);

/* The IPv4 address (network byte order) that a device of ibv_get_device_list is bound to (0 for a
 * device of an IPv6 address): librdmacm
 * finds an iWARP device by it, since an iWARP GID holds the interface's MAC, not the address. */
uint32_t softrdma_device_ipv4(struct ibv_device *dev);

/* The address of either family a device is bound to, as the 16 bytes of a GID (an IPv4 address
 * IPv4-mapped, ::ffff:a.b.c.d): an iWARP device's IPv6 address has no other way out. 0, or EINVAL
 * for no device. */
int softrdma_device_ip(struct ibv_device *dev, uint8_t out[16]);

/* Wire protection of a RoCEv2 QP's packets (docs/security.md): every packet it sends carries an
 * AES-GCM tag (and, ENCRYPT, its payload encrypted), every packet it receives must verify. */
enum softrdma_wire_mode {
  SOFTRDMA_WIRE_OFF = 0,
  SOFTRDMA_WIRE_AUTH = 1,    /* headers and payload authenticated, payload in clear */
  SOFTRDMA_WIRE_ENCRYPT = 2, /* headers authenticated, payload encrypted and authenticated */
};

/* Installs the connection's secret (16 bytes: AES-128-GCM, 32: AES-256-GCM) on an RC or UC QP in
 * RESET or INIT; at RTR the per-direction keys are derived from it, both ends' IPv4 addresses and
 * QPNs. The peer QP must install the same secret and mode. A secret must protect one connection only:
 * never install one twice (GCM nonces would repeat). RESET forgets it. 0 or an errno (EINVAL: mode,
 * length, state, QP type or device). librdmacm calls it with keys agreed in the CM exchange. */
int softrdma_qp_set_wire_key(struct ibv_qp *qp, uint32_t mode, const void *secret, size_t len);

/* librdmacm refused, or was refused, a connection on this device for a wire protection mismatch:
 * counted in the device's auth_cm_reject. */
void softrdma_count_wire_reject(struct ibv_context *ctx);

/* 1 when the kernel of the peer of ctx's connected RC QP number qpn says the peer's process is gone
 * (its context's liveness listener refused or closed: docs/reliability.md), else 0 (alive, stopped,
 * unknown, no such QP in ctx, or not a softrdma peer). librdmacm asks it from its CM thread for
 * connections to other hosts, by number: the application may destroy the QP at any time. */
int softrdma_qpn_peer_gone(struct ibv_context *ctx, uint32_t qpn);

/* Why librdmacm reported DISCONNECTED on a connected id without the application asking: the peer sent
 * a DREQ, or its process was found gone without one (docs/rdmacm.md). Counted on the device:
 * cm_dreq_rcvd, cm_peer_gone. (Not on the QP: the application may have destroyed it already.) */
enum softrdma_cm_disconnect { SOFTRDMA_CM_DREQ_RCVD = 0, SOFTRDMA_CM_PEER_GONE = 1 };
void softrdma_count_cm_disconnect(struct ibv_context *ctx, int why);

/* The process exits: every context sends the ACKs its application's last poll held for the answer
 * it did not post (transport/engine.h, held_), so that its peers' last messages complete. librdmacm
 * calls it before its DREQs; libibverbs' own atexit handler too. */
void softrdma_flush_held_acks(void);

/* softrdma_open_device's options. */
enum softrdma_open_flags {
  SOFTRDMA_OPEN_PACKETS = 1 << 0, /* no intra-host direct path: every peer by packets, as SOFTRDMA_DIRECT=0 */
};

/* Opens the device of this name among all of softrdma's devices, RoCE and iWARP, whatever
 * SOFTRDMA_TRANSPORT selects, so that a test picks its device and path without the environment. Its
 * settings are the configuration table's, as ibv_open_device reads them (SOFTRDMA_DIRECT=0 turns the
 * direct path off here too); SOFTRDMA_OPEN_PACKETS turns it off whatever the table says.
 * NULL with errno set (EINVAL: flags; ENODEV: no such device) on failure. */
struct ibv_context *softrdma_open_device(const char *name, uint32_t flags);

/* softrdma_open_device with settings of this context's own, so that an in-process test configures
 * each context it opens without setenv: `settings` is "SOFTRDMA_X=v;SOFTRDMA_Y=w" (NULL or "": none;
 * a value holds no ';'; "SOFTRDMA_X=" is the default, whatever the environment says). They win over
 * the process's settings (softrdma_set_option, then the environment) for this context only, and are
 * checked against the configuration table (src/config, `softrdma config`). A context takes the
 * variables it reads when it opens and keeps: SOFTRDMA_DIRECT, SOFTRDMA_IMPAIR, SOFTRDMA_SPIN_US,
 * SOFTRDMA_GSO, SOFTRDMA_COUNTERS, SOFTRDMA_DIRECT_PEERS, SOFTRDMA_STATS_MODE and SOFTRDMA_PEER_PAUSE_MS.
 * The others are the
 * process's: give them with softrdma_set_option.
 * softrdma_iwarp_attach decides on the direct path by the process's table (SOFTRDMA_DIRECT,
 * SOFTRDMA_IMPAIR), as librdmacm does, not by the context's.
 * NULL with errno set on failure: EINVAL (flags; settings not NAME=VALUE, a name not in the table or
 * not a context's, a value its type does not take), ENODEV (no such device). */
struct ibv_context *softrdma_open_device_with(const char *name, uint32_t flags, const char *settings);

/* Sets a SOFTRDMA_* variable of this process's libibverbs without the environment (for in-process
 * tests): every later read of libibverbs takes `value` instead of the environment's -- device lists,
 * contexts opened after, the QPN registry and tuple table if not opened yet. NULL: the environment's
 * value again; "": the default. It does not reach librdmacm, which has its own table: a process that
 * uses rdma_cm calls librdmacm's softrdma_cm_set_option, which sets both. A process-wide setting,
 * like the environment it stands for: contexts opened before keep theirs.
 * 0, or EINVAL (a name not in the table, a value its type does not take). Thread-safe. */
int softrdma_set_option(const char *name, const char *value);

#ifdef __cplusplus
}
#endif

#endif
