"""The benchmarks: `python -m bench.run` (throughput and latency against the anchors), `python -m bench.instructions`
(instructions per call, the measure of a change to the per-call path), and the probes beside them. See bench/README.md."""
