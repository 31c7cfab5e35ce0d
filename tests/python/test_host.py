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
    (lambda d: ibev.wait_for(d, d, types=[-1], timeout=1), ValueError,
     "event code -1 is negative"),
], ids=["open without a dispatcher", "a sink that is not callable", "a batch of 0",
        "a wait on a string", "a wait on a dispatcher", "a remove that is not callable",
        "an endpoint that is not one", "a wait for a negative event code"])
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


def _documented(name, doc):
    """Whether doc says more than pybind11's signature lines for name."""
    lines = [line for line in (doc or "").splitlines()
             if line.strip() and not line.startswith(f"{name}(")
             and not line.lstrip().startswith(tuple(f"{i}. {name}(" for i in range(1, 9)))
             and line.strip() != "Overloaded function."]
    return bool(lines)


def _undocumented():
    missing = []
    for name in ibev.__all__:
        value = getattr(ibev, name)
        if isinstance(value, int):
            continue  # the constants: rdma-core's names and values
        if not _documented(name, value.__doc__):
            missing.append(name)
        if not isinstance(value, type):
            continue
        members = {}
        for klass in reversed(value.__mro__):  # inherited too (ibev.Dispatcher's)
            if klass.__module__.startswith("ibev"):
                members.update(vars(klass))
        for attribute, member in members.items():
            if attribute.startswith("_") and attribute not in ("__init__", "__enter__",
                                                               "__exit__"):
                continue
            if attribute == "__init__" and not _documented(attribute, member.__doc__):
                if _documented(name, value.__doc__):
                    continue  # the class's docstring says how to make one
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if not _documented(attribute, getattr(member, "__doc__", None)):
                missing.append(f"{name}.{attribute}")
    return missing


def test_every_public_callable_says_what_it_does():
    """help(ibev.X) is what a Python user reads: every class, function,
    method and property of the module has a docstring beyond its signature."""
    assert _undocumented() == []


def test_a_worker_thread_runs_tasks_in_order_on_its_thread_and_reports_what_they_raise():
    import threading
    ran, failures = [], []
    with ibev.WorkerThread(on_failure=lambda kind, text: failures.append((kind, text))) as worker:
        for i in range(3):
            worker.post(lambda i=i: ran.append((i, threading.get_ident())))
        worker.post(lambda: 1 / 0)
    assert worker.closed  # close() ran what was posted, then joined
    assert [i for i, _ in ran] == [0, 1, 2]
    assert len({thread for _, thread in ran}) == 1 and ran[0][1] != threading.get_ident()
    assert len(failures) == 1 and failures[0][0] == "handler threw"
    assert "ZeroDivisionError" in failures[0][1]
    with pytest.raises(ValueError, match="closed"):
        worker.post(print)
    worker.close()  # again: nothing


def test_write_metrics_is_the_prometheus_text_of_the_dispatcher():
    with ibev.Dispatcher() as dispatcher:
        dispatcher.run_once(0)
        text = ibev.write_metrics(dispatcher)
    assert "# TYPE ibev_dispatcher_turns_total counter" in text
    assert any(line.startswith("ibev_dispatcher_turns_total ") for line in text.splitlines())
    with pytest.raises(ValueError, match="the Dispatcher is closed"):
        ibev.write_metrics(dispatcher)


def test_the_cm_channel_is_made_or_refused_naming_the_verb_and_errno():
    with ibev.Dispatcher() as dispatcher:
        try:
            ibev.CmEventChannel(dispatcher)
        except OSError as e:  # no rdma_cm in this kernel
            assert e.errno == errno.ENODEV and "rdma_create_event_channel" in str(e)


def test_a_cm_id_refuses_bad_input_and_a_closed_one_names_the_verb_and_errno():
    """Without rdma_cm (no channel) there is no id to ask: skipped. A bad
    address or timeout is a ValueError before librdmacm is asked; a closed
    id raises OSError(ENODEV) naming the librdmacm call."""
    with ibev.Dispatcher() as dispatcher:
        try:
            channel = ibev.CmEventChannel(dispatcher)
        except OSError:
            pytest.skip("no rdma_cm in this kernel")
        with ibev.CmId(channel, print) as cm_id:
            with pytest.raises(ValueError):
                cm_id.resolve_addr("not an address", 7471)
            with pytest.raises(ValueError, match="port"):
                cm_id.listen("::1", 70000)
            with pytest.raises(ValueError, match="timeout"):
                cm_id.resolve_route(timeout=-1)
        assert cm_id.closed
        with pytest.raises(OSError, match="rdma_resolve_addr") as raised:
            cm_id.resolve_addr("::1", 7471)
        assert raised.value.errno == errno.ENODEV
        with pytest.raises(OSError, match="rdma_disconnect") as raised:
            cm_id.disconnect()
        assert raised.value.errno == errno.ENODEV
        cm_id.close()  # again: nothing
        del cm_id, channel


@pytest.mark.parametrize("options, message", [
    (dict(first_delay=0), "first_delay"),
    (dict(max_delay=0.01), "max_delay"),
    (dict(jitter=2), "jitter"),
    (dict(max_recoveries=0), "recoveries"),
    (dict(keepalive=1, misses=0), "keepalive"),
    (dict(keepalive=-1), "keepalive must be a finite number"),
    (dict(deadline=float("inf")), "deadline must be a finite number"),
    (dict(mode="in place"), "mode is 'reset in place' or 'reconnect'"),
    (dict(initial="recovering"), "initial is 'up' or 'down'"),
    (dict(port=0), "port 0"),
], ids=lambda value: str(value))
def test_health_options_refuse_what_connection_health_refuses(options, message):
    with pytest.raises(ValueError, match=message):
        ibev.HealthOptions(**options)


def test_health_and_sessions_refuse_bad_arguments_with_type_errors():
    with pytest.raises(TypeError):
        ibev.ConnectionHealth("not a QueuePair", print)
    with pytest.raises(TypeError):
        ibev.HealthOptions(executor="not a WorkerThread")
    with pytest.raises(TypeError, match="callable"):
        ibev.WorkerThread(on_failure=5)


RECORDING = """{"recording":"ibev","version":1,"time":"2026-11-27T12:00:00.000000Z"}
{"time":"2026-11-27T12:00:00.000000Z","device":"rxe0","change":"added","node":"uverbs0"}
{"time":"2026-11-27T12:00:01.000000Z","device":"rxe0","event":"IBV_EVENT_PORT_ERR","code":10,"scope":"port","port":1,"severity":"error"}
{"time":"2026-11-27T12:00:10.000000Z","device":"rxe0","event":"IBV_EVENT_PORT_ACTIVE","code":9,"scope":"port","port":1,"severity":"informational"}
"""


def test_a_replay_without_the_recorded_device_skips_its_events_and_hands_over_changes():
    changes = []
    with ibev.Dispatcher() as dispatcher:
        replay = ibev.Replay(dispatcher, speed=0,
                             on_change=lambda device, change: changes.append((device, change)))
        stats = replay.play(RECORDING, "flap.jsonl")
    assert (stats.injected, stats.skipped, stats.changes, stats.stopped) == (0, 2, 1, False)
    assert changes == [("rxe0", "added")]


@pytest.mark.parametrize("make, message", [
    (lambda d: ibev.Replay(d, speed=-1), "speed"),
    (lambda d: ibev.Replay(d, speed=0).play("not json\n", "bad.jsonl"), "bad.jsonl:1"),
    (lambda d: ibev.Replay(d, devices=["rxe0"]), "incompatible|Device"),
], ids=["a negative speed", "a line that is not JSON", "a device that is not a Device"])
def test_a_replay_refuses_bad_input_naming_it(make, message):
    with ibev.Dispatcher() as dispatcher:
        with pytest.raises((ValueError, TypeError), match=message):
            make(dispatcher)


def test_ctrl_c_stops_a_replay_waiting_for_its_next_event():
    took, stderr = interrupted(
        "import ibev\n"
        "d = ibev.Dispatcher()\n"
        f"recording = {RECORDING!r}\n"
        "replay = ibev.Replay(d)\n"
        "print('waiting', flush=True)\n"
        "replay.play(recording)\n")
    assert "KeyboardInterrupt" in stderr, stderr
    assert took < 1.0, f"SIGINT took {took:.2f} s to end a 10 s replay"
