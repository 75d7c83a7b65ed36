"""CPU of encode_block (4 shards x 250 000 streams) and encode_histogram (1 001 011 nodes)."""
import sys, time
import numpy as np
from stream_dp.compact import encode_block
from stream_dp.compact_histograms import encode_histogram
import stream_dp
rng = np.random.default_rng(1)
v = rng.normal(size=250_000); e = np.full(250_000, 3.0)
hv, hn, he = (rng.normal(size=1_001_011) for _ in range(3))
kw = dict(shard="shard-0", tick=5, tick_start=0.0, tick_end=10.0, epoch=0, strategy="tree",
          p=1.0, privacy={"model": "zcdp", "rho": 0.5}, cap=1.0, horizon=100, manifest="ab" * 32)
def blocks():
    for _ in range(4):
        encode_block(values=v, stderr=e, **kw)
def hist():
    encode_histogram(domain="d", tick=5, tick_end=10.0, values=hv, noisy=hn, stderr=he,
                     manifest="cd" * 32)
for name, fn in (("4 compact records", blocks), ("histogram chunks", hist)):
    fn()
    ts = []
    for _ in range(15):
        t = time.process_time(); fn(); ts.append(time.process_time() - t)
    print(stream_dp.__file__.split("/")[2], name, "median ms %.1f" % (1e3 * sorted(ts)[7]))
