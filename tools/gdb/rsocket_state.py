# gdb script: the state of every rsocket of a process (src/rdmacm/rsocket.cpp), for a program stuck on
# rsockets. Needs librdmacm.so.1 built with debug information (the default RelWithDebInfo does).
#   gdb -batch -p PID -ex "source tools/gdb/rsocket_state.py"
# Prints each rsocket's flow-control counters, the peer's iomap table as this side sees it, this
# side's riomap'd buffers (with the last byte of each, where riostream keeps its marker) and the
# mapping that backs each of them (/proc/PID/maps).
import gdb

FIELDS = ['type', 'state', 'err', 'sqe_avail', 'sseq_no', 'sseq_comp', 'sbuf_bytes_avail', 'target_sge',
          'rseq_no', 'rseq_comp', 'rbuf_bytes_avail', 'rmsg_head', 'rmsg_tail', 'ctrl_seqno',
          'ctrl_max_seqno', 'sq_inline', 'target_iomap_size', 'cq_armed', 'msg_send']


def vector_items(v):
    begin, end = v['_M_impl']['_M_start'], v['_M_impl']['_M_finish']
    for k in range(int(end - begin)):
        yield (begin + k).dereference()


def backing(pid, addr):
    with open('/proc/%d/maps' % pid) as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))
            if lo <= addr < hi:
                return line.strip()
    return '?'


table = gdb.parse_and_eval("'softrdma::rsock::(anonymous namespace)::g_table'")
pid = gdb.selected_inferior().pid
for fd in range(int(table.type.sizeof // table[0].type.sizeof)):
    p = table[fd]['_M_b']['_M_p']
    if int(p) == 0:
        continue
    rs = p.dereference()
    print('rsocket %d: %s' % (fd, ', '.join('%s=%s' % (f, rs[f]) for f in FIELDS)))
    if int(rs['target_iomap']) != 0:
        for k in range(int(rs['target_iomap_size'])):
            e = rs['target_iomap'][k]
            print('  peer iomap[%d]: offset %s addr %#x length %s rkey %#x' % (
                k, e['offset'], int(e['sge']['addr']), e['sge']['length'], int(e['sge']['key'])))
    for k, m in enumerate(vector_items(rs['remote_iomappings'])):
        mr = m['mr']
        if int(mr) == 0:
            continue
        addr, length = int(mr['addr']), int(mr['length'])
        last = int(gdb.parse_and_eval('*(unsigned char*)%d' % (addr + length - 1)))
        print('  own riomap slot %s: offset %s addr %#x length %d rkey %#x, last byte %d' % (
            m['index'], m['offset'], addr, length, int(mr['rkey']), last))
        print('    backed by: %s' % backing(pid, addr))
    print('  announcements queued: %d' % sum(1 for _ in vector_items(rs['iomap_queue'])))
