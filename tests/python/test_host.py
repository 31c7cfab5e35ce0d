"""The Python module without a device: the dispatcher's life, and bad input
raising a Python exception with a clear message (wrong types, values out of
range, a closed Dispatcher, a device that is not there), never a crash."""

import errno

import pytest

import ibev
from children import interrupted


def test_the_event_codes_are_rdma_cores():
    assert ibev.IBV_EVENT_CQ_ERR == 0
    assert ibev.IBV_EVENT_PORT_ERR == 10
    assert ibev.IBV_EVENT_WQ_FATAL == 19
    assert ibev.__version__.count(".") == 2


def test_a_dispatcher_runs_on_its_thread_or_in_run_once():
    with ibev.Dispatcher() as dispatcher:
        assert dispatcher.fd() >= 0
        assert dispatcher.run_once(0.01) == 0
        dispatcher.start()
        assert dispatcher.running
        with pytest.raises(RuntimeError, match="run_once"):
            dispatcher.run_once(0)
        dispatcher.stop()
        assert not dispatcher.running


def test_a_closed_dispatcher_raises_value_error():
    dispatcher = ibev.Dispatcher()
    dispatcher.close()
    for call in (dispatcher.start, dispatcher.fd, lambda: dispatcher.run_once(0),
                 lambda: ibev.Device.open(dispatcher), lambda: ibev.DeviceClients(dispatcher)):
        with pytest.raises(ValueError, match="the Dispatcher is closed"):
            call()
    dispatcher.close()  # again: nothing


def test_a_device_that_is_not_there_is_oserror_enodev():
    with ibev.Dispatcher() as dispatcher:
        with pytest.raises(OSError) as raised:
            ibev.Device.open(dispatcher, "no-such-device")
        assert raised.value.errno == errno.ENODEV
        assert "no-such-device" in str(raised.value)


@pytest.mark.parametrize("call, exception, message", [
    (lambda d: ibev.Device.open("not a dispatcher"), TypeError,
     "Device.open needs a Dispatcher, not str"),
    (lambda d: ibev.Dispatcher(on_failure=5), TypeError, "on_failure must be callable"),
    (lambda d: ibev.Dispatcher(batch=0), ValueError, "batch"),
    (lambda d: ibev.wait_for(d, "a string", timeout=1), TypeError, "not str"),
    (lambda d: ibev.wait_for(d, d, timeout=1), TypeError, "not Dispatcher"),
    (lambda d: ibev.DeviceClients(d).register("c", print, 5), TypeError, "callable"),
    (lambda d: ibev.RcEndpoint.from_wire(b"0000:zz"), ValueError, "not 51"),
], ids=["open without a dispatcher", "a sink that is not callable", "a batch of 0",
        "a wait on a string", "a wait on a dispatcher", "a remove that is not callable",
        "an endpoint that is not one"])
def test_bad_input_raises_with_a_clear_message(call, exception, message):
    with ibev.Dispatcher() as dispatcher:
        with pytest.raises(exception, match=message):
            call(dispatcher)


def test_device_clients_end_with_their_dispatcher():
    dispatcher = ibev.Dispatcher()
    clients = ibev.DeviceClients(dispatcher)
    dispatcher.close()  # ends the clients first: C++ wants them gone before it
    with pytest.raises(ValueError, match="closed"):
        clients.register("late", print, print)


def test_ctrl_c_interrupts_a_blocking_run_once():
    took, stderr = interrupted(
        "import ibev\n"
        "d = ibev.Dispatcher()\n"
        "print('waiting', flush=True)\n"
        "d.run_once(10.0)\n"
        "print('returned', flush=True)\n")
    assert "KeyboardInterrupt" in stderr
    assert took < 1.0, f"SIGINT took {took:.2f} s to end a 10 s run_once"
