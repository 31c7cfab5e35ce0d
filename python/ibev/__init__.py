"""ibev: RDMA async events with the kernel's event model, for Python.

Objects take their event handlers when they are made, devices keep
listeners, device clients hear devices come and go, and one Dispatcher
serves every device, completion queue and fd:

    dispatcher = ibev.Dispatcher(on_failure=print)
    device = ibev.Device.open(dispatcher, "rxe0")
    listener = device.listen(print, types=[ibev.IBV_EVENT_PORT_ERR])
    dispatcher.start()                  # or ibev.drive(dispatcher) in asyncio
    event = ibev.wait_for(dispatcher, device, [ibev.IBV_EVENT_PORT_ACTIVE],
                          timeout=5).wait()

Threads: handlers run on the dispatching thread (the Dispatcher's own after
start(), or the caller of run_once(): the asyncio loop's with drive()), with
the GIL taken. What a handler raises becomes a failure record (on_failure,
or one line on stderr) and dispatch goes on. Calls that wait for a handler
(stop, close, release, drain, EventWait.wait) release the GIL while they
wait. Bad input raises: TypeError (wrong types), ValueError (out of range, a
closed Dispatcher, a wait on the dispatching thread), OSError with the errno
(a verb that failed; ENODEV for an object closed or a device gone).
"""

import asyncio

from ._ibev import *  # noqa: F401,F403 (the API is the native module's)
from ._ibev import Device, Dispatcher, __version__, wait_for

__all__ = [name for name in dir() if not name.startswith("_")] + ["__version__"]


class DeviceLost(ConnectionError):
    """The target's device went away while next_event waited (.event says how)."""

    def __init__(self, event):
        super().__init__(f"the device is gone: {event!r}")
        self.event = event


def drive(dispatcher, loop=None):
    """Serves dispatcher from an asyncio loop: its run_once() runs whenever
    its fd is readable, so handlers run on the loop's thread. Returns a
    function that stops it (before the loop or the Dispatcher closes)."""
    loop = loop or asyncio.get_running_loop()
    fd = dispatcher.fd()
    loop.add_reader(fd, dispatcher.run_once, 0.0)
    return lambda: loop.remove_reader(fd)


def _settle(future, result):
    if not future.done():
        future.set_result(result)


def next_event(dispatcher, target, types=None, *, port=None, timeout):
    """The next event of target (a Device, QueuePair, CompletionQueue or
    SharedReceiveQueue) that types and port take, as an awaitable: armed now,
    when called, so call it before the action that raises the event and
    await it after. TimeoutError after timeout seconds, DeviceLost if the
    target's device goes first. Call it from a running asyncio loop."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    handle = wait_for(dispatcher, target, types, port=port, timeout=timeout,
                      done=lambda result: loop.call_soon_threadsafe(_settle, future, result))
    return _outcome(future, handle, timeout)


async def _outcome(future, handle, timeout):
    try:
        result = await future
    finally:
        handle.release()
    if result.outcome == "timed out":
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
