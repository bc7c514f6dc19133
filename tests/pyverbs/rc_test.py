#!/usr/bin/python3
"""An RC QP pair through pyverbs' public API: SEND, RDMA WRITE and RDMA READ, each checked byte for
byte, every completion checked (status, opcode, wr_id, QP number; byte_len of RECV and READ),
then a WRITE with a wrong rkey, which must complete with a remote access error.

The two QPs are connected by hand (RESET->INIT->RTR->RTS) with the port's GID: on RoCE a GRH with a
RoCE v2 GID index, on InfiniBand the LID. Nothing here is specific to softrdma.

  rc_test.py [-d DEV]                      both QPs in this process, one thread each
  rc_test.py [-d DEV] --server PORT        one QP; waits for the client on TCP PORT
  rc_test.py [-d DEV] --client HOST PORT   the other QP, in another process or on another host

Prints "PASS ..." and exits 0 when everything matched; otherwise prints FAIL lines saying what
differed, and exits 1.
"""

import argparse
import json
import os
import queue
import random
import select
import socket
import subprocess
import sys
import threading
import time
import traceback

import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ, cqe_status_to_str
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import RecvWR, SGE, SendWR

WC_NAMES = {e.IBV_WC_SEND: 'SEND', e.IBV_WC_RDMA_WRITE: 'RDMA_WRITE',
            e.IBV_WC_RDMA_READ: 'RDMA_READ', e.IBV_WC_RECV: 'RECV'}


class Failure(Exception):
    pass


def pattern(seed, length):
    """Bytes both sides can compute from a seed, different for every operation."""
    return random.Random(seed).randbytes(length)


def describe_mismatch(got, want):
    if len(got) != len(want):
        return 'length %d, expected %d' % (len(got), len(want))
    bad = [i for i in range(len(want)) if got[i] != want[i]]
    return '%d of %d bytes differ, first at offset %d (0x%02x, expected 0x%02x)' % (
        len(bad), len(want), bad[0], got[bad[0]], want[bad[0]])


def pick_gid_index(ctx, port):
    """The first RoCE v2 GID, IPv4-mapped ones before others; 0 on InfiniBand (LID routed)."""
    attr = ctx.query_port(port)
    if attr.link_layer != e.IBV_LINK_LAYER_ETHERNET:
        return 0
    v2 = []
    for i in range(attr.gid_tbl_len):
        try:
            gid = str(ctx.query_gid(port, i))
            if gid == '0000:0000:0000:0000:0000:0000:0000:0000':
                continue
            if ctx.query_gid_type(port, i) == e.IBV_GID_TYPE_SYSFS_ROCE_V2:
                v2.append((not gid.startswith('0000:0000:0000:0000:0000:ffff:'), i))
        except Exception:  # an empty or unreadable entry: not a candidate
            continue
    if not v2:
        raise Failure('port %d has no RoCE v2 GID' % port)
    return min(v2)[1]


class Endpoint:
    """One side: device context, PD, one MR of three regions (SEND, WRITE, READ), CQs and an RC QP."""

    def __init__(self, args, name):
        self.name = name
        self.size = args.size
        self.port = args.ib_port
        self.timeout = args.timeout
        self.ctx = d.Context(name=args.device)
        self.port_attr = self.ctx.query_port(self.port)
        if self.port_attr.state != e.IBV_PORT_ACTIVE:
            raise Failure('%s port %d is not active (state %d)' % (args.device, self.port,
                                                                    self.port_attr.state))
        self.roce = self.port_attr.link_layer == e.IBV_LINK_LAYER_ETHERNET
        self.gid_index = args.gid_index if args.gid_index is not None else \
            pick_gid_index(self.ctx, self.port)
        self.gid = self.ctx.query_gid(self.port, self.gid_index)
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, 3 * self.size, e.IBV_ACCESS_LOCAL_WRITE |
                     e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
        self.mr.write(bytes(3 * self.size), 3 * self.size)
        self.scq = CQ(self.ctx, 16)
        self.rcq = CQ(self.ctx, 16)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.scq, rcq=self.rcq,
                                         cap=cap, sq_sig_all=0))
        self.psn = random.getrandbits(24)
        self.chan = None  # set by the role; polled so that a failed peer ends our wait early
        self.expect_state(e.IBV_QPS_RESET)

    def info(self):
        return {'qpn': self.qp.qp_num, 'psn': self.psn, 'gid': str(self.gid),
                'lid': self.port_attr.lid, 'mtu': self.port_attr.active_mtu,
                'addr': self.mr.buf, 'rkey': self.mr.rkey, 'size': self.size}

    def expect_state(self, state):
        attr, _ = self.qp.query(e.IBV_QP_STATE)
        if attr.qp_state != state:
            raise Failure('%s: QP state %d, expected %d' % (self.name, attr.qp_state, state))

    def connect(self, peer):
        """RESET->INIT->RTR->RTS towards the peer's QP, with explicit attribute masks."""
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=self.port)
        attr.pkey_index = 0
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | \
            e.IBV_ACCESS_REMOTE_READ
        self.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT |
                       e.IBV_QP_ACCESS_FLAGS)
        self.expect_state(e.IBV_QPS_INIT)

        attr = QPAttr(qp_state=e.IBV_QPS_RTR, port_num=self.port,
                      path_mtu=min(self.port_attr.active_mtu, peer['mtu']))
        attr.dest_qp_num = peer['qpn']
        attr.rq_psn = peer['psn']
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        if self.roce:
            gr = GlobalRoute(dgid=GID(peer['gid']), sgid_index=self.gid_index, hop_limit=64)
            attr.ah_attr = AHAttr(is_global=1, port_num=self.port, gr=gr)
        else:
            attr.ah_attr = AHAttr(dlid=peer['lid'], port_num=self.port)
        self.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU |
                       e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC |
                       e.IBV_QP_MIN_RNR_TIMER)
        self.expect_state(e.IBV_QPS_RTR)

        attr = QPAttr(qp_state=e.IBV_QPS_RTS, port_num=self.port)
        attr.sq_psn = self.psn
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.max_rd_atomic = 1
        self.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT |
                       e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
        self.expect_state(e.IBV_QPS_RTS)

    # Regions of the MR: 0 receives SENDs, 1 is written by the peer, 2 is read by the peer; a
    # requester's source/destination uses the same region of its own MR.
    def region(self, i):
        return self.mr.buf + i * self.size

    def read(self, i):
        return self.mr.read(self.size, i * self.size)

    def fill(self, i, data):
        self.mr.write(data, len(data), i * self.size)

    def post_recv(self, wr_id):
        sge = SGE(self.region(0), self.size, self.mr.lkey)
        self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[sge]))

    def post_send(self, wr_id, opcode, region, rkey=None, raddr=None):
        sge = SGE(self.region(region), self.size, self.mr.lkey)
        wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge],
                    send_flags=e.IBV_SEND_SIGNALED)
        if rkey is not None:
            wr.set_wr_rdma(rkey, raddr)
        self.qp.post_send(wr)

    def poll(self, cq, what):
        deadline = time.monotonic() + self.timeout
        idle = 0
        while True:
            n, wcs = cq.poll()
            if n:
                return wcs[0]
            if idle % 256 == 255 and self.chan is not None and self.chan.peer_failed():
                raise Failure('%s: the other side failed while we waited for %s' % (self.name,
                                                                                    what))
            if time.monotonic() > deadline:
                raise Failure('%s: no completion for %s within %gs' % (self.name, what,
                                                                       self.timeout))
            idle += 1
            if idle > 1000:  # the peer thread (or a busy host) needs the CPU too
                time.sleep(0.0005)

    def expect_wc(self, cq, what, wr_id, opcode, byte_len=None, status=e.IBV_WC_SUCCESS):
        wc = self.poll(cq, what)
        problems = []
        if wc.status != status:
            problems.append('status %d (%s), expected %d (%s)' % (
                wc.status, cqe_status_to_str(wc.status), status, cqe_status_to_str(status)))
        if status == e.IBV_WC_SUCCESS:  # the other fields are undefined in error completions
            if wc.opcode != opcode:
                problems.append('opcode %s, expected %s' % (WC_NAMES.get(wc.opcode, wc.opcode),
                                                            WC_NAMES[opcode]))
            if byte_len is not None and wc.byte_len != byte_len:
                problems.append('byte_len %d, expected %d' % (wc.byte_len, byte_len))
        if wc.wr_id != wr_id:
            problems.append('wr_id %d, expected %d' % (wc.wr_id, wr_id))
        if wc.qp_num != self.qp.qp_num:
            problems.append('qp_num %d, expected %d' % (wc.qp_num, self.qp.qp_num))
        if problems:
            raise Failure('%s: %s completion: %s' % (self.name, what, '; '.join(problems)))
        n, extra = cq.poll()
        if n:
            raise Failure('%s: unexpected extra completion after %s (wr_id %d, opcode %s)' % (
                self.name, what, extra[0].wr_id, WC_NAMES.get(extra[0].opcode, extra[0].opcode)))

    def expect_data(self, region, seed, what):
        got = self.read(region)
        want = pattern(seed, self.size)
        if got != want:
            raise Failure('%s: %s data: %s' % (self.name, what, describe_mismatch(got, want)))

    def expect_no_wc(self, cq, what):
        n, wcs = cq.poll()
        if n:
            raise Failure('%s: unexpected completion (%s): wr_id %d opcode %s' % (
                self.name, what, wcs[0].wr_id, WC_NAMES.get(wcs[0].opcode, wcs[0].opcode)))


# The two roles. The client is the requester of the one-sided operations; SEND goes both ways.
# `chan` carries JSON messages between them: a TCP socket, or a pair of queues between threads.

def log(ep, msg):
    print('%s: %s' % (ep.name, msg), flush=True)


def run_server(ep, chan, seeds):
    ep.chan = chan
    ep.connect(chan.recv('client info'))
    ep.post_recv(101)
    chan.send({'step': 'recv posted'})
    ep.expect_wc(ep.rcq, 'RECV of the client\'s SEND', 101, e.IBV_WC_RECV, ep.size)
    ep.expect_data(0, seeds['send_c2s'], 'SEND client->server')
    log(ep, 'SEND client->server: %d bytes received and verified' % ep.size)

    chan.recv('client recv posted')
    ep.fill(0, pattern(seeds['send_s2c'], ep.size))
    ep.post_send(102, e.IBV_WR_SEND, 0)
    ep.expect_wc(ep.scq, 'SEND', 102, e.IBV_WC_SEND)
    chan.send({'step': 'sent'})

    chan.recv('write done')
    ep.expect_data(1, seeds['write'], 'RDMA WRITE by the client')
    ep.expect_no_wc(ep.rcq, 'an RDMA WRITE consumes no receive')
    log(ep, 'RDMA WRITE by the client: %d bytes verified' % ep.size)
    ep.fill(2, pattern(seeds['read'], ep.size))
    chan.send({'step': 'read source filled'})

    chan.recv('read done')
    if bytes(ep.read(2)) != pattern(seeds['read'], ep.size):
        raise Failure('%s: the RDMA READ changed the source region' % ep.name)
    chan.send({'step': 'bye'})
    chan.recv('client finished')


def run_client(ep, chan, seeds):
    ep.chan = chan
    srv = chan.peer_info
    ep.connect(srv)
    chan.send(ep.info())

    chan.recv('server recv posted')
    ep.fill(0, pattern(seeds['send_c2s'], ep.size))
    ep.post_send(1, e.IBV_WR_SEND, 0)
    ep.expect_wc(ep.scq, 'SEND', 1, e.IBV_WC_SEND)
    log(ep, 'SEND client->server: completed')

    ep.fill(0, bytes(ep.size))
    ep.post_recv(2)
    chan.send({'step': 'recv posted'})
    ep.expect_wc(ep.rcq, 'RECV of the server\'s SEND', 2, e.IBV_WC_RECV, ep.size)
    ep.expect_data(0, seeds['send_s2c'], 'SEND server->client')
    chan.recv('server sent')
    log(ep, 'SEND server->client: %d bytes received and verified' % ep.size)

    ep.fill(1, pattern(seeds['write'], ep.size))
    ep.post_send(3, e.IBV_WR_RDMA_WRITE, 1, srv['rkey'], srv['addr'] + 1 * srv['size'])
    # byte_len is left undefined for a WRITE's completion (mlx5 does not set it); not checked.
    ep.expect_wc(ep.scq, 'RDMA WRITE', 3, e.IBV_WC_RDMA_WRITE)
    log(ep, 'RDMA WRITE: completed')
    chan.send({'step': 'write done'})

    chan.recv('server filled the read source')
    ep.post_send(4, e.IBV_WR_RDMA_READ, 2, srv['rkey'], srv['addr'] + 2 * srv['size'])
    ep.expect_wc(ep.scq, 'RDMA READ', 4, e.IBV_WC_RDMA_READ, ep.size)
    ep.expect_data(2, seeds['read'], 'RDMA READ')
    log(ep, 'RDMA READ: %d bytes read and verified' % ep.size)
    chan.send({'step': 'read done'})
    chan.recv('server bye')

    # Last, as it moves both QPs to the error state: a wrong rkey must be refused by the responder.
    ep.post_send(5, e.IBV_WR_RDMA_WRITE, 1, srv['rkey'] ^ 0x5a5a00, srv['addr'])
    ep.expect_wc(ep.scq, 'RDMA WRITE with a wrong rkey', 5, e.IBV_WC_RDMA_WRITE,
                 status=e.IBV_WC_REM_ACCESS_ERR)
    log(ep, 'RDMA WRITE with a wrong rkey: IBV_WC_REM_ACCESS_ERR, as expected')
    chan.send({'step': 'finished'})


class SocketChan:
    def __init__(self, sock):
        self.sock = sock
        self.file = sock.makefile('rw')

    def send(self, msg):
        self.file.write(json.dumps(msg) + '\n')
        self.file.flush()

    def peer_failed(self):
        """True once the peer closed the connection (a failed peer exits); nothing is consumed."""
        if not select.select([self.sock], [], [], 0)[0]:
            return False
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b''
        except BlockingIOError:
            return False
        except OSError:
            return True

    def recv(self, what):
        line = self.file.readline()
        if not line:
            raise Failure('the peer closed the connection while we waited for: %s' % what)
        return json.loads(line)


class QueueChan:
    def __init__(self, inbox, outbox, timeout, failed):
        self.inbox, self.outbox, self.timeout, self.failed = inbox, outbox, timeout, failed

    def peer_failed(self):
        return self.failed.is_set()

    def send(self, msg):
        self.outbox.put(msg)

    def recv(self, what):
        try:
            msg = self.inbox.get(timeout=self.timeout)
        except queue.Empty:
            raise Failure('no word from the other thread within %gs while waiting for: %s' % (
                self.timeout, what)) from None
        if msg is None:
            raise Failure('the other side failed while we waited for: %s' % what)
        return msg


def before_exit(args):
    """The --before-exit hook: a command run while the QPs still exist (e.g. to read counters)."""
    if args.before_exit:
        sys.stdout.flush()
        subprocess.run(args.before_exit.replace('{pid}', str(os.getpid())), shell=True,
                       check=False)
        sys.stdout.flush()


def new_seeds():
    return {k: random.getrandbits(64) for k in ('send_c2s', 'send_s2c', 'write', 'read')}


def one_process(args):
    server, client = Endpoint(args, 'server'), Endpoint(args, 'client')
    to_server, to_client = queue.Queue(), queue.Queue()
    seeds = new_seeds()
    failed = threading.Event()
    schan = QueueChan(to_server, to_client, args.timeout, failed)
    cchan = QueueChan(to_client, to_server, args.timeout, failed)
    cchan.peer_info = server.info()
    errors = []

    def role(fn, ep, chan, other_inbox):
        try:
            fn(ep, chan, seeds)
        except Exception as exc:  # reported by the main thread; wake the other side up
            if not isinstance(exc, Failure):
                traceback.print_exc()
            errors.append('%s: %s' % (type(exc).__name__, exc) if not isinstance(exc, Failure)
                          else str(exc))
            failed.set()
            other_inbox.put(None)

    threads = [threading.Thread(target=role, args=(run_server, server, schan, to_client)),
               threading.Thread(target=role, args=(run_client, client, cchan, to_server))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not errors:
        before_exit(args)
    return errors


def two_process(args):
    seeds = None
    if args.server is not None:
        lsock = socket.create_server(('', args.server), family=socket.AF_INET, reuse_port=False)
        sock, _ = lsock.accept()
        lsock.close()
        chan = SocketChan(sock)
        ep = Endpoint(args, 'server')
        hello = chan.recv('client hello')
        seeds = hello['seeds']
        chan.send(ep.info())
        run_server(ep, chan, seeds)
        before_exit(args)
    else:
        sock = socket.create_connection((args.client[0], int(args.client[1])),
                                        timeout=args.timeout)
        sock.settimeout(args.timeout)
        chan = SocketChan(sock)
        ep = Endpoint(args, 'client')
        seeds = new_seeds()
        chan.send({'seeds': seeds})
        chan.peer_info = chan.recv('server info')
        run_client(ep, chan, seeds)
    before_exit(args)
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('-d', '--device', help='RDMA device (default: the first one listed)')
    ap.add_argument('-i', '--ib-port', type=int, default=1)
    ap.add_argument('-g', '--gid-index', type=int,
                    help='GID index (default: the first RoCE v2 GID, IPv4-mapped ones first)')
    ap.add_argument('-s', '--size', type=int, default=100000,
                    help='bytes per operation (default 100000: many packets at any MTU)')
    ap.add_argument('-t', '--timeout', type=float, default=30,
                    help='seconds to wait for each completion or peer message')
    ap.add_argument('--before-exit', metavar='CMD',
                    help='shell command run after the checks passed, while the QPs are still '
                    'open ({pid} is replaced by our pid); its output goes to ours')
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument('--server', type=int, metavar='PORT')
    mode.add_argument('--client', nargs=2, metavar=('HOST', 'PORT'))
    args = ap.parse_args()
    if args.device is None:
        devs = d.get_device_list()
        if not devs:
            print('FAIL: no RDMA device', flush=True)
            return 1
        args.device = devs[0].name.decode()
    try:
        errors = two_process(args) if args.server is not None or args.client else \
            one_process(args)
    except Failure as exc:
        errors = [str(exc)]
    except Exception as exc:  # a verb that failed (PyverbsRDMAError...): say which
        traceback.print_exc()
        errors = ['%s: %s' % (type(exc).__name__, exc)]
    for err in errors:
        print('FAIL: %s' % err, flush=True)
    if errors:
        return 1
    print('PASS: RC SEND (both ways), RDMA WRITE, RDMA READ of %d bytes verified on %s (pid %d)' % (
        args.size, args.device, os.getpid()), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
