"""The far end of test_softroce.py's session test, in a process of its own
as a server application is: a CmAcceptor on ADDRESS:PORT (0: any) over
DEVICE that keeps every session it is given. It prints "listening PORT",
then "state STATE" for each change of its sessions, and runs until its
stdin closes (or it is killed: a peer that dies).

    session_peer.py DEVICE ADDRESS PORT
"""

import sys

import ibev


def main(device_name, address, port):
    dispatcher = ibev.Dispatcher(stall_after=0)
    device = ibev.Device.open(dispatcher, device_name)
    pd = ibev.ProtectionDomain(device)
    cq = ibev.CompletionQueue(device, lambda batch: None)
    mr = ibev.MemoryRegion(pd, bytearray(64 * 8))
    channel = ibev.CmEventChannel(dispatcher)
    sessions = []

    def make_qp(cm_id, attempt):
        qp = ibev.QueuePair(pd, cq, cq)
        cm_id.init_qp(qp)
        for slot in range(8):
            qp.post_recv(mr, 64 * slot, 64, wr_id=slot)
        return qp

    dispatcher.start()
    options = ibev.HealthOptions(first_delay=0.05, max_delay=0.4, give_up_after=5)
    acceptor = ibev.CmAcceptor.listen(
        channel, address, port, sessions.append,
        lambda session_id, change: print("state", change.state, flush=True), make_qp,
        options=options)
    print("listening", acceptor.local_port, flush=True)
    sys.stdin.read()
    acceptor.close()
    for session in sessions:
        session.close()
    dispatcher.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
