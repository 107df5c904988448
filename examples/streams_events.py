"""Device buffers on two streams, ordered by events: a copy stream feeds a communication stream.

Each rank fills a buffer on a "copy" stream, records an event there, and makes a "comm" stream
wait for that event before the all-reduce: the all-reduce starts only once its input is ready,
and nothing on the host waits in between. A second pair of events times the all-reduce on the
device. Every rank checks the result against NumPy.

Run it with any launcher; with none, it is a job of one rank::

    hcclpy run -n 4 examples/streams_events.py
    torchrun --nproc-per-node 4 examples/streams_events.py
    python examples/streams_events.py

Exit status 1 on a wrong result.
"""

import sys

import numpy as np

import hcclpy

COUNT = 1 << 16


def main() -> int:
    comm = hcclpy.init()
    device = comm.device
    try:
        with device.create_stream() as copies, device.create_stream() as comms:
            data = hcclpy.empty(COUNT, "float32", device=device)
            data.copy_from(np.full(COUNT, comm.rank + 1, dtype=np.float32), stream=copies)
            ready = copies.record()          # the input is on the device once this event is reached
            comms.wait_event(ready)          # the comm stream waits for it on the device, not the host
            start = comms.record()
            comm.all_reduce(data, stream=comms)
            end = comms.record()
            end.synchronize()
            result = data.to_numpy()
            milliseconds = start.elapsed_time(end)
            for event in (ready, start, end):
                event.close()
            data.close()
        expected = np.full(COUNT, comm.size * (comm.size + 1) / 2, dtype=np.float32)
        ok = np.array_equal(result, expected)
        print(f"rank {comm.rank} of {comm.size}: all_reduce of {COUNT * 4 // 1024} KiB after the copy stream's "
              f"event: {'OK' if ok else 'WRONG'} ({milliseconds:.3f} ms on the device)", flush=True)
        return 0 if ok else 1
    finally:
        hcclpy.shutdown()


if __name__ == "__main__":
    sys.exit(main())
