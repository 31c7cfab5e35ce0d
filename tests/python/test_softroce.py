"""The Python module on a real soft-RoCE device (root, rxe0 on the netdev
IBEV_TEST_NETDEV, as the soft-RoCE runner makes them): port events after a
link flap, awaited from asyncio too; an SRQ limit event; a device removed and
added again, heard by a client; a handler that raises; waits that time out;
closed objects and a wait on the dispatching thread raising clearly; the
example examples/python/watch.py printing a flap as JSON lines."""

import asyncio
import errno
import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

import ibev

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
    with ibev.Dispatcher(on_failure=failures) as d:
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


def _eventually(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.01)
    return True


def test_the_watch_example_prints_a_flap_as_json_lines():
    example = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "..", "..", "examples", "python", "watch.py")
    watch = subprocess.Popen([sys.executable, example, "--count", "3"],
                             stdout=subprocess.PIPE, text=True)
    # Its lines through a queue, so that a missing one fails the test in
    # 20 s rather than hanging it.
    printed = queue.Queue()
    threading.Thread(target=lambda: [printed.put(line) for line in watch.stdout],
                     daemon=True).start()
    try:
        added = json.loads(printed.get(timeout=20))
        assert added == {"device": DEVICE, "change": "added"}
        run(f"ip link set {NETDEV} down")
        run(f"ip link set {NETDEV} up")
        lines = [json.loads(printed.get(timeout=20)) for _ in range(2)]
        assert watch.wait(timeout=20) == 0
    finally:
        watch.kill()
    assert [(l["device"], l["event"], l["port"]) for l in lines] == [
        (DEVICE, "IBV_EVENT_PORT_ERR", 1), (DEVICE, "IBV_EVENT_PORT_ACTIVE", 1)]


def test_a_release_or_close_waits_for_a_running_handler_without_holding_the_gil(
        dispatcher, device):
    """The handler needs the GIL back to return; a release or close that
    waited for it holding the GIL would never return (the test would hang)."""
    entered, finished = threading.Event(), []

    def slow(event):
        entered.set()
        time.sleep(0.3)  # lets go of the GIL, and needs it back
        finished.append(event.code)

    handle = device.listen(slow, types=[ibev.IBV_EVENT_LID_CHANGE])
    dispatcher.start()
    dispatcher.inject(device, ibev.IBV_EVENT_LID_CHANGE, port=1)
    assert entered.wait(20)
    handle.release()
    assert finished == [ibev.IBV_EVENT_LID_CHANGE]  # returned after the handler

    entered.clear()
    with device.listen(slow, types=[ibev.IBV_EVENT_LID_CHANGE]):
        dispatcher.inject(device, ibev.IBV_EVENT_LID_CHANGE, port=1)
        assert entered.wait(20)
        dispatcher.close()
        assert finished == [ibev.IBV_EVENT_LID_CHANGE] * 2
