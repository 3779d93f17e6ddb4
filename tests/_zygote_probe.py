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
