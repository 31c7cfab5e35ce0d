"""The Python module on a real soft-RoCE device (root, rxe0 on the netdev
IBEV_TEST_NETDEV, as the soft-RoCE runner makes them): port events after a
link flap, awaited from asyncio too; an SRQ limit event; a device removed and
added again, heard by a client; a handler that raises; waits that time out;
closed objects and a wait on the dispatching thread raising clearly; a
listener after its Dispatcher closed raising ENODEV; SIGINT at its default,
so a KeyboardInterrupt can come; the
example examples/python/watch.py printing a flap as JSON lines."""

import asyncio
import errno
import faulthandler
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import ibev
from children import interrupted

DEVICE = os.environ.get("IBEV_TEST_DEVICE", "rxe0")
NETDEV = os.environ.get("IBEV_TEST_NETDEV", "d0")


def run(command):
    subprocess.run(command, shell=True, check=True)


class Failures:
    """Every failure a Dispatcher reports, as (kind, description)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = []

    def __call__(self, kind, description):
        with self.lock:
            self.seen.append((kind, description))


@pytest.fixture
def failures():
    return Failures()


@pytest.fixture
def dispatcher(failures):
    # No watchdog: under a sanitizer in the TCG VM a slow turn is no failure
    # of what these tests check.
    with ibev.Dispatcher(on_failure=failures, stall_after=0) as d:
        yield d


@pytest.fixture
def device(dispatcher):
    device = ibev.Device.open(dispatcher, DEVICE)
    yield device
    device.close()


def test_a_link_flap_raises_port_err_then_port_active(dispatcher, device, failures):
    heard = []
    states = []

    def listener(event):
        heard.append(event)
        states.append(device.port_state(1))  # refreshed before listeners run

    with device.listen(listener, types=[ibev.IBV_EVENT_PORT_ERR, ibev.IBV_EVENT_PORT_ACTIVE]):
        dispatcher.start()
        down = ibev.wait_for(dispatcher, device, [ibev.IBV_EVENT_PORT_ERR], timeout=20)
        run(f"ip link set {NETDEV} down")
        assert down.wait().outcome == "event"
        up = ibev.wait_for(dispatcher, device, [ibev.IBV_EVENT_PORT_ACTIVE], timeout=20)
        run(f"ip link set {NETDEV} up")
        result = up.wait()
        assert result.outcome == "event"
        assert result.event.port == 1 and result.event.device == DEVICE
        dispatcher.stop()
    assert [e.code for e in heard] == [ibev.IBV_EVENT_PORT_ERR, ibev.IBV_EVENT_PORT_ACTIVE]
    assert all(e.port == 1 and e.element_kind == "port" and not e.synthesized for e in heard)
    assert states == ["down", "active"]  # as ibv_port_state_str() spells them
    assert failures.seen == []


def test_asyncio_awaits_the_next_port_event(dispatcher, device):
    async def flap():
        stop = ibev.drive(dispatcher)
        try:
            down = device.next_event(ibev.IBV_EVENT_PORT_ERR, timeout=20)
            await (await asyncio.create_subprocess_shell(f"ip link set {NETDEV} down")).wait()
            event = await down
            assert event.code == ibev.IBV_EVENT_PORT_ERR and event.port == 1
            # Handlers ran on this thread: the loop's.
            up = device.next_event(ibev.IBV_EVENT_PORT_ACTIVE, port=1, timeout=20)
            await (await asyncio.create_subprocess_shell(f"ip link set {NETDEV} up")).wait()
            assert (await up).code == ibev.IBV_EVENT_PORT_ACTIVE
            with pytest.raises(TimeoutError):
                await device.next_event(ibev.IBV_EVENT_SM_CHANGE, timeout=0.2)
        finally:
            stop()

    asyncio.run(flap())


def test_an_srq_below_its_limit_raises_srq_limit_reached(dispatcher, device, failures):
    pd = ibev.ProtectionDomain(device)
    buffer = bytearray(64 * 16)
    mr = ibev.MemoryRegion(pd, buffer)
    completions = []
    srq_events = []
    cq = ibev.CompletionQueue(device, completions.extend)
    srq = ibev.SharedReceiveQueue(pd, on_event=srq_events.append, max_wr=16)
    sender = ibev.QueuePair(pd, cq, cq)
    receiver = ibev.QueuePair(pd, cq, cq, srq=srq)
    ibev.connect_rc_pair(sender, receiver)
    for i in range(8):
        srq.post_recv(mr, 64 * (8 + i), 64, wr_id=100 + i)
    srq.arm_limit(4)
    limit = ibev.wait_for(dispatcher, srq, [ibev.IBV_EVENT_SRQ_LIMIT_REACHED], timeout=20)
    dispatcher.start()
    buffer[0:5] = b"hello"
    for i in range(5):  # 8 - 5 = 3 receives left: below 4
        sender.post_send(mr, 0, 64, wr_id=i)
    result = limit.wait()
    assert result.outcome == "event"
    assert result.event.code == ibev.IBV_EVENT_SRQ_LIMIT_REACHED
    assert result.event.element_kind == "srq"
    receives = lambda: [wc for wc in list(completions) if wc.opcode == ibev.IBV_WC_RECV]
    assert _eventually(lambda: len(receives()) == 5)
    dispatcher.stop()
    assert [e.code for e in srq_events] == [ibev.IBV_EVENT_SRQ_LIMIT_REACHED]
    receives = receives()
    assert all(wc.status == ibev.IBV_WC_SUCCESS for wc in receives)
    assert all(wc.qp_num == receiver.qp_num and wc.byte_len == 64 for wc in receives)
    assert bytes(buffer[64 * 8:64 * 8 + 5]) == b"hello"
    assert failures.seen == []


def test_a_device_removed_and_added_again_is_heard_by_a_client(dispatcher, failures):
    added, removed = [], []
    clients = ibev.DeviceClients(dispatcher)
    registration = clients.register(
        "pytest", add=lambda device: added.append(device.name),
        remove=lambda device, loss: removed.append((device.name, loss)))
    dispatcher.start()
    try:
        assert _eventually(lambda: added == [DEVICE])
        run(f"rdma link delete {DEVICE}")
        assert _eventually(lambda: removed == [(DEVICE, "removed")])
    finally:
        if not os.path.exists(f"/sys/class/infiniband/{DEVICE}"):
            run(f"rdma link add {DEVICE} type rxe netdev {NETDEV}")
    assert _eventually(lambda: added == [DEVICE, DEVICE])
    registration.release()
    clients.close()
    dispatcher.stop()
    assert failures.seen == []


def test_a_handler_that_raises_is_a_failure_record_and_dispatch_goes_on(
        dispatcher, device, failures):
    heard = []

    def raising(event):
        raise ValueError(f"raised for {event.name}")

    with device.listen(raising, types=[ibev.IBV_EVENT_PORT_ERR]), \
            device.listen(heard.append, types=[ibev.IBV_EVENT_PORT_ERR]):
        dispatcher.inject(device, ibev.IBV_EVENT_PORT_ERR, port=1)
        dispatcher.inject(device, ibev.IBV_EVENT_PORT_ERR, port=1)
        while dispatcher.run_once(0.5) > 0:
            pass
    assert len(heard) == 2 and all(e.synthesized for e in heard)
    assert len(failures.seen) == 2
    for kind, description in failures.seen:
        assert kind == "handler threw"
        assert "ValueError: raised for" in description


def test_waits_that_time_out(dispatcher, device):
    dispatcher.start()
    result = ibev.wait_for(dispatcher, device, [ibev.IBV_EVENT_SM_CHANGE], timeout=0.2).wait()
    assert result.outcome == "timed out" and result.event is None
    dispatcher.stop()
    # Nobody dispatching: the wait still ends at its timeout.
    result = ibev.wait_for(dispatcher, device, [ibev.IBV_EVENT_SM_CHANGE], timeout=0.2).wait()
    assert result.outcome == "timed out"


def test_closed_objects_and_a_wait_on_the_dispatching_thread_raise(dispatcher, device):
    pd = ibev.ProtectionDomain(device)
    buffer = bytearray(64)
    mr = ibev.MemoryRegion(pd, buffer)
    cq = ibev.CompletionQueue(device, lambda batch: None)
    qp = ibev.QueuePair(pd, cq, cq)
    with pytest.raises(ValueError, match="outside the region"):
        qp.post_recv(mr, 32, 64)
    qp.close()
    with pytest.raises(OSError) as raised:
        qp.post_recv(mr, 0, 64)
    assert raised.value.errno == errno.ENODEV

    raised_in_handler = []

    def waits_in_handler(event):
        try:
            ibev.wait_for(dispatcher, device, [ibev.IBV_EVENT_SM_CHANGE], timeout=5).wait()
        except ValueError as e:
            raised_in_handler.append(str(e))

    with device.listen(waits_in_handler, types=[ibev.IBV_EVENT_LID_CHANGE]):
        dispatcher.inject(device, ibev.IBV_EVENT_LID_CHANGE, port=1)
        dispatcher.run_once(1.0)
    assert len(raised_in_handler) == 1 and "dispatching thread" in raised_in_handler[0]

    device.close()
    with pytest.raises(OSError) as raised:
        ibev.ProtectionDomain(device)
    assert raised.value.errno == errno.ENODEV


def test_a_listener_after_the_dispatcher_closed_is_oserror_enodev(failures):
    dispatcher = ibev.Dispatcher(on_failure=failures, stall_after=0)
    device = ibev.Device.open(dispatcher, DEVICE)
    dispatcher.close()  # nothing delivers to the device's listeners any more
    with pytest.raises(OSError) as raised:
        device.listen(print)
    assert raised.value.errno == errno.ENODEV
    assert "Dispatcher was destroyed" in str(raised.value)
    device.close()


def test_the_runner_leaves_sigint_to_python():
    # ibev-softroce-run once started the program with SIGINT and SIGQUIT
    # ignored; Python then installs no KeyboardInterrupt handler.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with open("/proc/self/status") as status:
        ignored = int(next(l for l in status if l.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGQUIT - 1)) == 0


def test_the_watch_example_prints_a_flap_as_json_lines():
    example = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "..", "..", "examples", "python", "watch.py")
    # --count 1: the device's line, then it exits by itself.
    once = subprocess.run([sys.executable, example, "--count", "1"], capture_output=True,
                          text=True, timeout=60)
    assert once.returncode == 0, once.stderr
    assert [json.loads(line) for line in once.stdout.splitlines()] == [
        {"device": DEVICE, "change": "added"}]

    watch = subprocess.Popen([sys.executable, example], stdout=subprocess.PIPE, text=True)
    # Its lines through a queue, so that a missing one fails the test in
    # 20 s rather than hanging it.
    printed = queue.Queue()
    threading.Thread(target=lambda: [printed.put(line) for line in watch.stdout],
                     daemon=True).start()
    try:
        assert json.loads(printed.get(timeout=20)) == {"device": DEVICE, "change": "added"}
        run(f"ip link set {NETDEV} down")
        run(f"ip link set {NETDEV} up")
        port_events = []
        while len(port_events) < 2:  # any other event (a GID change) is printed too
            line = json.loads(printed.get(timeout=20))
            if line.get("element") == "port" and line["event"] != "IBV_EVENT_GID_CHANGE":
                port_events.append((line["device"], line["event"], line["port"]))
    finally:
        watch.kill()
    assert port_events == [(DEVICE, "IBV_EVENT_PORT_ERR", 1), (DEVICE, "IBV_EVENT_PORT_ACTIVE", 1)]


def test_a_release_or_close_waits_for_a_running_handler_without_holding_the_gil(
        dispatcher, device):
    """The handler is held inside its call until the release (or close) is
    under way on another thread, then needs the GIL to return: a release
    that waited holding the GIL would never return, and the watchdog below
    fails the test instead of letting it hang."""
    faulthandler.dump_traceback_later(120, exit=True)
    try:
        entered, go, finished = threading.Event(), threading.Event(), []

        def held(event):
            entered.set()
            go.wait(20)  # lets go of the GIL, and needs it back
            finished.append(event.code)

        dispatcher.start()
        for end in ("release", "close"):
            entered.clear()
            go.clear()
            handle = device.listen(held, types=[ibev.IBV_EVENT_LID_CHANGE])
            dispatcher.inject(device, ibev.IBV_EVENT_LID_CHANGE, port=1)
            assert entered.wait(20)
            ending = threading.Thread(target=handle.release if end == "release" else dispatcher.close)
            ending.start()
            ending.join(0.5)
            assert ending.is_alive(), f"{end} returned while the handler ran"
            go.set()  # needs the GIL: held by a waiting release, this never runs
            ending.join(20)
            assert not ending.is_alive()
            assert finished == [ibev.IBV_EVENT_LID_CHANGE] * (1 if end == "release" else 2)
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_exit_with_a_dispatcher_still_running_is_clean():
    """A Dispatcher left running (a handler busy, events queued, a handler
    that keeps its own registration alive) when the interpreter exits: it is
    closed at exit, and the process ends with status 0."""
    script = f"""
import ibev
dispatcher = ibev.Dispatcher()
device = ibev.Device.open(dispatcher, {DEVICE!r})
class Keeper:
    def on_event(self, event):
        self.seen = getattr(self, "seen", 0) + 1
keeper = Keeper()
keeper.handle = device.listen(keeper.on_event)  # a cycle through C++
dispatcher.start()
for _ in range(2000):
    dispatcher.inject(device, ibev.IBV_EVENT_LID_CHANGE, port=1)
print("exiting")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"


def test_a_raising_completion_handler_is_a_failure_record(dispatcher, device, failures):
    pd = ibev.ProtectionDomain(device)
    buffer = bytearray(128)
    mr = ibev.MemoryRegion(pd, buffer)
    calls = []

    def raising(batch):
        calls.extend(batch)
        raise RuntimeError("a completion handler that raises")

    cq = ibev.CompletionQueue(device, raising)
    a, b = ibev.QueuePair(pd, cq, cq), ibev.QueuePair(pd, cq, cq)
    ibev.connect_rc_pair(a, b)
    b.post_recv(mr, 64, 64)
    dispatcher.start()
    a.post_send(mr, 0, 64)
    assert _eventually(lambda: len(calls) == 2)  # the send's and the receive's
    dispatcher.stop()
    assert failures.seen and all(kind == "handler threw" for kind, _ in failures.seen)
    assert "RuntimeError: a completion handler that raises" in failures.seen[0][1]


def test_buffers_waits_and_objects_refused_with_a_clear_exception(dispatcher, device):
    pd = ibev.ProtectionDomain(device)
    with pytest.raises(BufferError):  # every other byte: not one block
        ibev.MemoryRegion(pd, memoryview(bytearray(64))[::2])
    with pytest.raises((BufferError, TypeError)):  # read-only, for the device to write
        ibev.MemoryRegion(pd, b"read only")
    ibev.MemoryRegion(pd, b"read only", access=0).close()  # read-only, for reading
    with pytest.raises(ValueError, match="finite"):
        ibev.wait_for(dispatcher, device, timeout=float("nan"))
    waiting = ibev.wait_for(dispatcher, device, [ibev.IBV_EVENT_SM_CHANGE], timeout=5)
    waiting.cancel()
    with pytest.raises(ValueError, match="cancelled"):
        waiting.wait()
    with ibev.Dispatcher() as other:
        with pytest.raises(ValueError, match="another Dispatcher"):
            ibev.wait_for(other, device, timeout=1)
        with pytest.raises(ValueError, match="another Dispatcher"):
            other.inject(device, ibev.IBV_EVENT_PORT_ERR, port=1)
    cq = ibev.CompletionQueue(device, lambda batch: None)
    cq.close()
    with pytest.raises(OSError, match="closed") as raised:
        ibev.wait_for(dispatcher, cq, timeout=1)
    assert raised.value.errno == errno.ENODEV

    async def undriven():  # nothing serves the Dispatcher: the await still ends
        with pytest.raises(TimeoutError):
            await device.next_event(ibev.IBV_EVENT_SM_CHANGE, timeout=0.2)
    asyncio.run(undriven())


def _eventually(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.01)
    return True


def test_ctrl_c_interrupts_a_blocking_event_wait():
    """SIGINT to a process blocked in a 10 s EventWait.wait(): it ends with
    KeyboardInterrupt within a second (the wait runs Python's signal
    handlers every 50 ms, as time.sleep does), not at the timeout."""
    took, stderr = interrupted(f"""
import ibev
dispatcher = ibev.Dispatcher()
device = ibev.Device.open(dispatcher, {DEVICE!r})
dispatcher.start()
waiting = ibev.wait_for(dispatcher, device, [ibev.IBV_EVENT_SM_CHANGE], timeout=10)
print("waiting", flush=True)
waiting.wait()
""")
    assert "KeyboardInterrupt" in stderr, stderr
    assert took < 1.0, f"SIGINT took {took:.2f} s to end a 10 s EventWait.wait()"


ADDRESS = os.environ.get("IBEV_TEST_ADDRESS", "fd00::1")


def _next_change(changes, state, timeout=20):
    """The next HealthChange to state, from a queue of them (others skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        change = changes.get(timeout=max(deadline - time.monotonic(), 0.01))
        if change.state == state:
            return change


def test_connection_health_goes_down_with_its_cause_and_recovers_in_place(
        dispatcher, device, failures):
    """A QP_FATAL takes an up connection down (one change, with the event
    as its cause); the recovery resets the QP and hands reconnect() an
    attempt, which connects it to a new peer QP: the connection is up again
    and its causes are cleared. With a WorkerThread as executor, the handler
    and reconnect run there, not on the dispatching thread."""
    pd = ibev.ProtectionDomain(device)
    cq = ibev.CompletionQueue(device, lambda batch: None)
    dispatching = []  # the QP's own handler runs on the dispatching thread
    a = ibev.QueuePair(pd, cq, cq, on_event=lambda event: dispatching.append(threading.get_ident()))
    b = ibev.QueuePair(pd, cq, cq)
    ibev.connect_rc_pair(a, b)
    changes, attempts, threads = queue.Queue(), [], []
    peers = [b]

    def reconnect(attempt):
        threads.append(threading.get_ident())
        attempts.append((attempt.number, attempt.cause.what))
        peer = ibev.QueuePair(pd, cq, cq)
        peer.connect(attempt.local)
        peers.append(peer)
        attempt.connect(peer.endpoint())

    def on_change(change):
        threads.append(threading.get_ident())
        changes.put(change)

    worker = ibev.WorkerThread(on_failure=failures)
    options = ibev.HealthOptions(first_delay=0.05, max_delay=0.2, give_up_after=10,
                                 executor=worker)
    dispatcher.start()
    with ibev.ConnectionHealth(a, on_change, options, reconnect=reconnect) as health:
        assert health.state == "up" and health.causes() == []
        dispatcher.inject(device, ibev.IBV_EVENT_QP_FATAL, qp=a)
        down = _next_change(changes, "down")
        assert (down.previous, down.cause.source, down.cause.code) == (
            "up", "async event", ibev.IBV_EVENT_QP_FATAL)
        assert _next_change(changes, "recovering").cause.code == ibev.IBV_EVENT_QP_FATAL
        _next_change(changes, "up")
        assert health.state == "up" and health.causes() == []
        assert attempts == [(1, "IBV_EVENT_QP_FATAL")]
        assert health.queue_pair.qp_num == a.qp_num  # in place: the same QP
        health.fail("the test is over")
        assert _next_change(changes, "failed").cause.what == "the test is over"
    worker.close()
    # One thread, the worker's: neither this one nor the dispatching one.
    assert len(set(threads)) == 1 and threads[0] != threading.get_ident()
    assert dispatching and threads[0] != dispatching[0]
    dispatcher.stop()
    assert failures.seen == []


@pytest.fixture
def cm_address():
    """ADDRESS on NETDEV, once rxe0's GID table lists it (rdma_cm binds to it)."""
    run(f"ip -6 addr replace {ADDRESS}/64 dev {NETDEV} nodad")
    packed = socket.inet_pton(socket.AF_INET6, ADDRESS).hex()
    gid = ":".join(packed[i:i + 4] for i in range(0, 32, 4))
    gids = f"/sys/class/infiniband/{DEVICE}/ports/1/gids"

    def listed():
        for index in range(16):
            try:
                with open(f"{gids}/{index}") as entry:
                    if entry.read().strip() == gid:
                        return True
            except OSError:
                pass
        return False
    assert _eventually(listed), f"{ADDRESS} not in {DEVICE}'s GID table"
    return ADDRESS


def test_a_session_goes_down_when_its_peer_is_killed_and_up_when_it_is_back(
        dispatcher, device, failures, cm_address):
    """A CmSession to a CmAcceptor in another process: SIGKILL the peer and
    the session goes down with a cause (the CM's disconnect, or the
    keepalive: 3 x 0.3 s) within seconds; start the peer again on the same
    port and the session's recovery connects to it: up again."""
    peer_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "session_peer.py")

    def start_peer(port):
        peer = subprocess.Popen([sys.executable, peer_script, DEVICE, ADDRESS, str(port)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line.strip()) for line in peer.stdout],
                         daemon=True).start()
        first = lines.get(timeout=20)
        assert first.startswith("listening "), first
        return peer, int(first.split()[1]), lines

    pd = ibev.ProtectionDomain(device)
    cq = ibev.CompletionQueue(device, lambda batch: None)
    mr = ibev.MemoryRegion(pd, bytearray(64 * 8))
    made, lent = [], []

    def make_qp(cm_id, attempt):
        assert cm_id.device_name == DEVICE
        lent.append(cm_id)
        qp = ibev.QueuePair(pd, cq, cq)
        cm_id.init_qp(qp)
        for slot in range(8):
            qp.post_recv(mr, 64 * slot, 64, wr_id=slot)
        made.append(qp)
        return qp

    channel = ibev.CmEventChannel(dispatcher)
    dispatcher.start()
    peer, port, peer_lines = start_peer(0)
    changes = queue.Queue()
    options = ibev.HealthOptions(keepalive=0.3, misses=3, first_delay=0.05, max_delay=0.4,
                                 give_up_after=30)
    try:
        with ibev.CmSession.connect(channel, ADDRESS, port, changes.put, make_qp, id=42,
                                    options=options) as session:
            _next_change(changes, "up")
            assert session.id == 42 and session.health.state == "up"
            assert session.queue_pair.qp_num == made[-1].qp_num
            killed = time.monotonic()
            peer.kill()
            peer.wait()
            down = _next_change(changes, "down")
            noticed = time.monotonic() - killed
            assert down.previous == "up" and down.cause.source in (
                "CM event", "keepalive", "completion", "async event"), down
            assert noticed < 3 * 0.3 + 4, f"noticed in {noticed:.2f} s ({down.cause})"
            peer, _, peer_lines = start_peer(port)
            up = _next_change(changes, "up", timeout=30)
            assert up.previous == "recovering"
            assert session.health.state == "up" and session.health.causes() == []
            while (line := peer_lines.get(timeout=20)) != "state up":  # the peer's session
                assert line.startswith("state "), line
            assert len(made) >= 2  # a new QP for the new connection
            # The id make_qp was handed is a CmId, lent: over after its call.
            assert isinstance(lent[0], ibev.CmId) and lent[0].closed
            with pytest.raises(OSError, match="CmId.device_name") as raised:
                lent[0].device_name
            assert raised.value.errno == errno.ENODEV
            with pytest.raises(ValueError, match="lent"):
                lent[0].close()
    finally:
        peer.stdin.close()
        peer.wait(timeout=20)
    dispatcher.stop()
    assert failures.seen == [], failures.seen


def test_two_cm_ids_connect_exchange_a_message_and_both_hear_disconnected(
        dispatcher, device, failures, cm_address):
    """A listener CmId and a client CmId in one process over rxe0: the client
    resolves and connects with private data, the listener's handler hears
    CONNECT_REQUEST with the new id and accepts it with a QP of its own; one
    SEND crosses; the client disconnects, the server's id hears
    DISCONNECTED (its event's id is the one accepted) and answers, and the
    client hears DISCONNECTED too. Bad input and a closed id raise clearly."""
    pd = ibev.ProtectionDomain(device)
    completions = queue.Queue()
    cq = ibev.CompletionQueue(device, lambda batch: [completions.put(wc) for wc in batch])
    buffer = bytearray(64 * 2)
    mr = ibev.MemoryRegion(pd, buffer)
    server_events, client_events = queue.Queue(), queue.Queue()
    accepted = []  # (the new id, its QP), kept: dropped, the request is rejected
    client_qp = []

    def on_server(event):
        if event.code == ibev.RDMA_CM_EVENT_CONNECT_REQUEST:
            qp = ibev.QueuePair(pd, cq, cq)
            event.id.init_qp(qp)
            qp.post_recv(mr, 0, 64, wr_id=1)
            event.id.accept(qp, private_data=b"welcome")
            accepted.append((event.id, qp))
        elif event.code == ibev.RDMA_CM_EVENT_DISCONNECTED:
            event.id.disconnect()  # the DREP, as rping answers
        server_events.put((event.type, event.id, event.private_data))

    def on_client(event):
        if event.code == ibev.RDMA_CM_EVENT_ADDR_RESOLVED:
            event.id.resolve_route(timeout=2)
        elif event.code == ibev.RDMA_CM_EVENT_ROUTE_RESOLVED:
            assert event.id.device_name == DEVICE
            qp = ibev.QueuePair(pd, cq, cq)
            client_qp.append(qp)
            event.id.connect(qp, private_data=b"hello", retry_count=3)
        client_events.put((event.type, event.id, event.private_data))

    def next_event(events, wanted):
        while True:
            kind, cm_id, data = events.get(timeout=10)
            assert kind not in ("RDMA_CM_EVENT_ADDR_ERROR", "RDMA_CM_EVENT_ROUTE_ERROR",
                                "RDMA_CM_EVENT_REJECTED", "RDMA_CM_EVENT_UNREACHABLE",
                                "RDMA_CM_EVENT_CONNECT_ERROR"), kind
            if kind == wanted:
                return cm_id, data

    channel = ibev.CmEventChannel(dispatcher)
    dispatcher.start()
    with ibev.CmId(channel, on_server) as listener, ibev.CmId(channel, on_client) as client:
        with pytest.raises(ValueError):
            client.resolve_addr("not an address", 7471)
        listener.listen(ADDRESS, 0, backlog=4)
        port = listener.local_port
        assert port != 0 and listener.local_address.endswith(f":{port}")
        client.resolve_addr(ADDRESS, port, timeout=2)
        child, data = next_event(server_events, "RDMA_CM_EVENT_CONNECT_REQUEST")
        assert data.startswith(b"hello") and child != listener
        assert next_event(server_events, "RDMA_CM_EVENT_ESTABLISHED")[0] == child
        cm_id, data = next_event(client_events, "RDMA_CM_EVENT_ESTABLISHED")
        assert cm_id == client and data.startswith(b"welcome")
        assert client.queue_pair.qp_num == client_qp[0].qp_num
        assert child.peer_address == client.local_address

        buffer[64:68] = b"ping"
        client_qp[0].post_send(mr, 64, 4, wr_id=2)
        seen = {}
        while len(seen) < 2:
            wc = completions.get(timeout=10)
            seen[wc.wr_id] = wc
        assert seen[1].status == ibev.IBV_WC_SUCCESS and seen[1].byte_len == 4
        assert seen[2].status == ibev.IBV_WC_SUCCESS
        assert bytes(buffer[:4]) == b"ping"

        client.disconnect()
        assert next_event(server_events, "RDMA_CM_EVENT_DISCONNECTED")[0] == child
        assert next_event(client_events, "RDMA_CM_EVENT_DISCONNECTED")[0] == client
    with pytest.raises(OSError, match="rdma_resolve_addr") as raised:
        client.resolve_addr(ADDRESS, port)
    assert raised.value.errno == errno.ENODEV
    for cm_id, _ in accepted:
        cm_id.close()
    dispatcher.stop()
    assert failures.seen == [], failures.seen
