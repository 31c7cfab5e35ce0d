"""ibev: RDMA async events with the kernel's event model, for Python.

Objects take their event handlers when they are made, devices keep
listeners, device clients hear devices come and go, and one Dispatcher
serves every device, completion queue and fd:

    dispatcher = ibev.Dispatcher(on_failure=print)
    device = ibev.Device.open(dispatcher, "rxe0")
    listener = device.listen(print, types=[ibev.IBV_EVENT_PORT_ERR])
    dispatcher.start()
    event = ibev.wait_for(dispatcher, device, [ibev.IBV_EVENT_PORT_ACTIVE],
                          timeout=5).wait()
    # in asyncio: stop = ibev.drive(dispatcher); await device.next_event(...)

A connection's health and its recovery: ConnectionHealth(qp, on_change,
HealthOptions(keepalive=0.3), reconnect=...) over a QP, or a CmSession (and
its server side, a CmAcceptor) that reconnects through the CM by itself;
on_change(HealthChange) hears up, down (with its HealthCause), recovering,
failed. CmId(channel, handler) is an rdma_cm id of one's own (resolve,
listen, connect, accept, disconnect), its handler given a CmEvent (for
CONNECT_REQUEST, event.id is the new id to accept or reject). A WorkerThread given as HealthOptions(executor=...) runs those
handlers off the dispatching thread. write_metrics() is the Prometheus text;
Replay plays a recording (ibev-watch --json) into a Dispatcher.

Threads: handlers run on the dispatching thread (the Dispatcher's own after
start(), or the caller of run_once(): the asyncio loop's with drive()), with
the GIL taken. What a handler raises becomes a failure record (on_failure,
or one line on stderr) and dispatch goes on. Calls that wait for a handler
(stop, close, release, drain, EventWait.wait) release the GIL while they
wait; Ctrl-C interrupts EventWait.wait and run_once (KeyboardInterrupt). Bad input raises: TypeError (wrong types), ValueError (out of range, a
closed Dispatcher, a blocking wait on the dispatching thread, an object of
another Dispatcher), RuntimeError (a controlling call out of turn: start()
twice, run_once() while started, a drain on the dispatching thread), OSError
with the errno (a verb that failed; ENODEV for an object closed or a device
gone). As in C++, stop posting on an object before closing it (or its
device being removed): posting is not waited for. A handler that refers to
its own registration makes a cycle Python's collector cannot see through
C++: release it explicitly. Dispatchers still open at exit are closed then.
"""

import asyncio
import atexit
import weakref

from . import _ibev
from ._ibev import *  # noqa: F401,F403 (the API is the native module's)
from ._ibev import Device, __version__, wait_for

# Every Dispatcher made, closed at exit if still open: CPython ends threads
# that ask for the GIL once finalization has begun, and a dispatching thread
# ended inside a handler would take the process down with it.
_dispatchers = weakref.WeakSet()


class Dispatcher(_ibev.Dispatcher):
    __doc__ = _ibev.Dispatcher.__doc__

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _dispatchers.add(self)


@atexit.register
def _close_dispatchers():
    for dispatcher in list(_dispatchers):
        dispatcher.close()


class DeviceLost(ConnectionError):
    """The target's device went away while next_event waited (.event says how)."""

    def __init__(self, event):
        super().__init__(f"the device is gone: {event!r}")
        self.event = event


def drive(dispatcher, loop=None):
    """Serves dispatcher from an asyncio loop: its run_once() runs whenever
    its fd is readable, so handlers run on the loop's thread. Returns a
    function that stops it; call it before closing the Dispatcher. Not for a
    started Dispatcher (ValueError). A blocking wait (EventWait.wait,
    QueuePair.drain) in a coroutine blocks the loop, which then serves
    nothing until its timeout: await next_event instead."""
    if dispatcher.running:
        raise ValueError("drive: the Dispatcher runs on its own thread (started)")
    loop = loop or asyncio.get_running_loop()
    fd = dispatcher.fd()

    def serve():
        if dispatcher.closed:
            loop.remove_reader(fd)
        else:
            dispatcher.run_once(0.0)

    loop.add_reader(fd, serve)
    return lambda: loop.remove_reader(fd)


def _settle(future, result):
    if not future.done():
        future.set_result(result)


def next_event(dispatcher, target, types=None, *, port=None, timeout):
    """The next event of target (a Device, QueuePair, CompletionQueue or
    SharedReceiveQueue) that types and port take, as an awaitable: armed now,
    when called, so call it before the action that raises the event and
    await it after. TimeoutError after timeout seconds (whether or not
    anything serves the Dispatcher), DeviceLost if the target's device goes
    first. Call it from a running asyncio loop."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def done(result):  # on the dispatching thread
        try:
            loop.call_soon_threadsafe(_settle, future, result)
        except RuntimeError:
            pass  # the loop is closed: nobody awaits it any more

    handle = wait_for(dispatcher, target, types, port=port, timeout=timeout, done=done)
    # The wait's own timer runs in the Dispatcher's loop, which may not be
    # served: the asyncio loop keeps the deadline too.
    deadline = loop.call_later(timeout, _settle, future, None)
    return _outcome(future, handle, deadline, timeout)


async def _outcome(future, handle, deadline, timeout):
    try:
        result = await future
    finally:
        deadline.cancel()
        handle.release()
    if result is None or result.outcome == "timed out":
        raise TimeoutError(f"no event within {timeout} s")
    if result.outcome == "device lost":
        raise DeviceLost(result.event)
    return result.event


def _device_next_event(self, types=None, *, port=None, timeout):
    if isinstance(types, int):
        types = [types]
    return next_event(self.dispatcher, self, types, port=port, timeout=timeout)


_device_next_event.__doc__ = ("await device.next_event(IBV_EVENT_PORT_ACTIVE, timeout=5): "
                              "next_event() on the Dispatcher the device was opened on.")
Device.next_event = _device_next_event

__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and not isinstance(value, type(asyncio)))
