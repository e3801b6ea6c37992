"""CPU per call of the transports, paired: one daemon, the transports taking turns.

bench/run.py starts a fresh daemon per run and transport, which is what users
get, but on a shared machine its CPU figures swing by 10-30% from one run to
the next, more than the differences between the transports on workload a.
Here one bridge serves every transport, and each round runs N sequential
calls (workload a's shape) of each transport in turn, so that whatever the
machine does meanwhile falls on all of them alike. CPU is read from
/proc/PID/schedstat (time on a CPU, user and kernel) of the bridge and its
server; the medians over the rounds are printed with their ratio to HTTP+SSE.
Then where it goes: the bridge's user and kernel time (/proc/PID/stat, in
clock ticks, so a round needs a few thousand calls to say much), the server's
time, and how often per call the bridge went to sleep (voluntary context
switches): what tells user-space work from the kernel's.

    python -m bench.paired                    # sse, streamable, stateless; 7 rounds of 3,000 calls
    python -m bench.paired --rounds 5 --calls 2000

Loopback only; it stops exactly the processes it started.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
from bench import run as harness  # the config and the helpers of bench/run.py
from bench.instructions import drive

WARMUP_CALLS = 300


def _on_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


TICK = os.sysconf("SC_CLK_TCK")


def _user_system(pid: int) -> tuple[float, float]:
    """Seconds in user space and in the kernel (whole clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def _sleeps(pid: int) -> int:
    """Voluntary context switches: how often the process waited for something."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


class Sample(NamedTuple):
    """One round of one transport, per call: CPU µs of bridge + server, calls per second,
    and where the time went."""

    cpu: float
    rate: float
    bridge_user: float
    bridge_system: float
    server: float
    sleeps: float


def _processes(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [pid, *(int(child) for child in f.read().split())]


def measure(transports: list[str], rounds: int, calls: int) -> dict[str, Sample]:
    """Transport -> the medians of its rounds."""
    samples: dict[str, list[Sample]] = {t: [] for t in transports}
    with tempfile.TemporaryDirectory(prefix="mcp-bridge-paired-") as workdir:
        config, log = os.path.join(workdir, "bridge.yaml"), os.path.join(workdir, "bridge.log")
        harness.bridge_config(config)
        proc = harness.spawn([sys.executable, "-m", "bridge", "--config", config, "--port", "0"], log, cwd=harness.ROOT)
        try:
            port = harness.bridge_port(proc, log)

            def url(transport: str) -> str:
                return f"http://127.0.0.1:{port}/servers/bench/{'sse' if transport == 'sse' else 'mcp'}"

            for transport in transports:
                drive(transport, url(transport), WARMUP_CALLS)
            for _ in range(rounds):
                for transport in transports:
                    pids = _processes(proc.pid)  # the server's, as it is now (a restart would show here)
                    before, started = [_on_cpu(p) for p in pids], time.monotonic()
                    split, sleeps = _user_system(proc.pid), _sleeps(proc.pid)
                    drive(transport, url(transport), calls)
                    wall = time.monotonic() - started
                    after, split_after = [_on_cpu(p) for p in pids], _user_system(proc.pid)
                    per_call = 1e6 / calls
                    samples[transport].append(
                        Sample(
                            (sum(after) - sum(before)) * per_call,
                            calls / wall,
                            (split_after[0] - split[0]) * per_call,
                            (split_after[1] - split[1]) * per_call,
                            (sum(after[1:]) - sum(before[1:])) * per_call,
                            (_sleeps(proc.pid) - sleeps) / calls,
                        )
                    )
        finally:
            harness.Target("bridge", proc).stop()
    return {t: Sample(*(statistics.median(s[i] for s in got) for i in range(len(Sample._fields)))) for t, got in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transport", default="sse,streamable,stateless", help="comma-separated: sse, streamable, stateless")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    transports = args.transport.split(",")
    unknown = [t for t in transports if t not in harness.TRANSPORTS]
    if unknown:
        parser.error(f"unknown transport {', '.join(unknown)} (known: {', '.join(harness.TRANSPORTS)})")
    found = measure(transports, args.rounds, args.calls)
    base = found.get("sse")
    print(f"one bridge, {args.rounds} rounds of {args.calls:,} sequential calls per transport (medians; CPU: bridge + server on a CPU):")
    for transport, got in found.items():
        ratio = f"   {got.rate / base.rate:.2f}x / {got.cpu / base.cpu:.2f}x HTTP+SSE" if base and transport != "sse" else ""
        print(f"  {harness.TRANSPORTS[transport]:<16}{got.rate:>8,.0f} req/s {got.cpu:>6.0f} µs/call{ratio}")
    print("where it goes, per call: bridge user µs, bridge kernel µs, server µs, times the bridge slept:")
    for transport, got in found.items():
        print(f"  {harness.TRANSPORTS[transport]:<16}{got.bridge_user:>6.0f}{got.bridge_system:>6.0f}{got.server:>6.0f}{got.sleeps:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
