"""What one fire-and-forget Ray actor call costs the two processes, in CPU time, against one
message on dlc's direct channel (`syncer.channel: direct`, `dlc.net.channel`).

    python bench/ray_calls.py [--calls 3000] [--gap-ms 2] [--repeats 2]

One actor sends another `--calls` calls, one every `--gap-ms` (as a learner pushes and the
syncer delivers: a call at a time, never a burst), to a method in a one-thread concurrency group
(as `LearnerWorker.deliver` and `SyncerWorker.push` are). Each process reads its own CPU time
from `os.times()`; the sender's idle loop (the same sleeps, no call) is measured and taken off.
The same sends then go on a direct channel between the two actors (a `Hub` in the receiver, an
`Uplink` in the sender). Payloads: a bare int, and a merged fragment of tiny (int4, 9,200 values)
as the syncer sends it; each as a Ray call with and without a return object, and on the channel.
Prints a Markdown table and records it, with the command, commit, machine and date, in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import ray
import runner


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


@ray.remote(max_concurrency=2, concurrency_groups={"in_order": 1})
class Receiver:
    def __init__(self) -> None:
        self.calls = 0

    @ray.method(concurrency_group="in_order")
    def take(self, message: object) -> None:
        self.calls += 1

    @ray.method(concurrency_group="in_order", num_returns=0)
    def take_no_return(self, message: object) -> None:
        self.calls += 1

    def count(self) -> int:
        return self.calls

    def open_channel(self) -> tuple[tuple[str, int], bytes]:
        from dlc.net.channel import Hub

        self.hub = Hub("127.0.0.1", lambda message: self.take(message))
        return self.hub.address, self.hub.authkey

    def cpu_s(self) -> float:
        return cpu_s()


@ray.remote
class Sender:
    def connect(self, channel: tuple[tuple[str, int], bytes]) -> None:
        from dlc.net.channel import Uplink

        self.uplink = Uplink(lambda message: None)
        self.uplink.connect(*channel, learner=0)

    def send(self, receiver: object, calls: int, gap_s: float, message: object, returns: bool | None) -> float:
        """CPU seconds of `calls` sends, a gap apart (returns None: the gaps alone, no send; receiver
        None: on the direct channel)."""
        if receiver is None:
            method = self.uplink
        else:
            method = None if returns is None else receiver.take if returns else receiver.take_no_return
        start = cpu_s()
        for _ in range(calls):
            if method is not None:
                method.remote(message)
            time.sleep(gap_s)
        return cpu_s() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--results", default=str(runner.RESULTS))
    args = ap.parse_args()
    from dlc.algo.decoupled.messages import MergedFragment
    from dlc.config.job import ClusterConfig
    from dlc.core.codec import get_codec
    from dlc.engine.cluster import start_cluster, stop_cluster

    start_cluster(ClusterConfig(num_cpus=4), cpus_needed=4)  # embedded, on 127.0.0.1, as `dlc train`'s
    try:
        receiver, sender = Receiver.remote(), Sender.remote()
        ray.get([receiver.count.remote(), sender.__ray_ready__.remote()])
        ray.get(sender.connect.remote(ray.get(receiver.open_channel.remote())))
        fragment = np.random.default_rng(0).standard_normal(9200).astype(np.float32)
        merged = MergedFragment(3, 10, get_codec("int4", 64).encode(fragment), 0.0, ((0, 5), (1, 7)), base_version=9)
        payloads = {"int": 1, "merged fragment (int4, 9,200 values)": merged}
        gap_s, n = args.gap_ms / 1000, args.calls
        idle = statistics.median(ray.get(sender.send.remote(receiver, n, gap_s, 1, None)) for _ in range(2)) / n
        rows = []
        for name, message in payloads.items():
            for how in ("ray call, return object", "ray call, no return", "direct channel"):
                sent, taken = [], []
                to, returns = (None, False) if how == "direct channel" else (receiver, how.endswith("object"))
                for _ in range(args.repeats):
                    before, done = ray.get(receiver.cpu_s.remote()), ray.get(receiver.count.remote())
                    sent.append(ray.get(sender.send.remote(to, n, gap_s, message, returns)) / n - idle)
                    while ray.get(receiver.count.remote()) < done + n:
                        time.sleep(0.01)
                    taken.append((ray.get(receiver.cpu_s.remote()) - before) / n)
                rows.append((name, how, statistics.median(sent), statistics.median(taken)))
    finally:
        stop_cluster()
    lines = [
        f"ray {ray.__version__}; one message every {args.gap_ms:g} ms, {n} of them per payload and way, the median "
        f"of {args.repeats} repeats.",
        "",
        "| payload | sent as | sender CPU per message (ms) | receiver CPU per message (ms) | both |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {name} | {how} | {1e3 * s:.3f} | {1e3 * r:.3f} | {1e3 * (s + r):.3f} |" for name, how, s, r in rows]
    options = ["--calls", str(n), "--gap-ms", f"{args.gap_ms:g}", "--repeats", str(args.repeats)]
    provenance = runner.Provenance.here(runner.bench_command("ray_calls.py", options))
    runner.record("What a message costs, on the channel and as a Ray call", provenance, "\n".join(lines), args.results)


if __name__ == "__main__":
    main()
