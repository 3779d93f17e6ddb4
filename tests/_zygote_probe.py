"""What a process forked by the zygote (node/sim/zygote.py) sees, printed for tests/test_zygote.py."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time


def probe() -> None:
    import numpy

    args = sys.argv[1:]

    print(json.dumps({"pid": os.getpid(), "sid": os.getsid(0), "random": random.random(),
                      "numpy": float(numpy.random.random()), "threads": threading.active_count(),
                      "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler, "args": args}))
    if args[:1] == ["sleep"]:
        time.sleep(float(args[1]))
    if args[:1] == ["exit"]:
        sys.exit(int(args[1]))
    if args[:1] in (["hold"], ["take"]):  # hivemind's lock that every DHT result passes through
        from hivemind.utils.mpfuture import MPFuture

        if args[0] == "hold":
            MPFuture._update_lock.acquire()
            print("held", flush=True)
            time.sleep(600)
        print(json.dumps({"took": MPFuture._update_lock.acquire(timeout=5.0)}), flush=True)
