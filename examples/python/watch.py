#!/usr/bin/env python3
"""Prints every async event of every RDMA device as a JSON line, following
devices as they come and go (ibev's device clients): ibev-watch in a page.

    python3 watch.py [--count N]      (N lines, then exit; 0: until Ctrl-C)
"""
import argparse
import json
import sys
import threading

import ibev


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=0, help="exit after N lines")
    count = parser.parse_args().count
    printed, done, listeners = [0], threading.Event(), {}

    def emit(**record):  # on the dispatching thread, one call at a time
        print(json.dumps(record), flush=True)
        printed[0] += 1
        if count and printed[0] >= count:
            done.set()

    def on_event(e):
        emit(device=e.device, event=e.type_name or e.code, element=e.element_kind,
             port=e.port, qp_num=e.qp_num, loss=e.loss, synthesized=e.synthesized)

    def add(device):
        listeners[device.node] = device.listen(on_event)
        emit(device=device.name, change="added")

    def remove(device, loss):
        listeners.pop(device.node).release()
        emit(device=device.name, change="removed", loss=loss)

    with ibev.Dispatcher(on_failure=lambda kind, text: print(text, file=sys.stderr)) as dispatcher:
        clients = ibev.DeviceClients(dispatcher)
        with clients.register("watch.py", add, remove):
            dispatcher.start()
            try:
                done.wait()
            except KeyboardInterrupt:
                pass
            dispatcher.stop()


if __name__ == "__main__":
    main()
