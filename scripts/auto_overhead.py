"""Seconds `auto` spends per plain iteration outside the target: the controller alone, and with
prompt lookup watched (its proposal, the budget and the walk), on a 300-token context whose
text repeats itself a third of the time. The cost curve is the 1.5B's on the AVX-512 machine."""
import time

import numpy as np

from localspec.control.cascade import CascadeConfig
from localspec.control.controllers import CascadeController
from localspec.drafters.lookup import LookupDrafter
from localspec.llama.cost import CostCurve

curve = CostCurve([0.040, 0.068, 0.0955, 0.114, 0.133, 0.162, 0.186, 0.251, 0.29, 0.29, 0.32, 0.32, 0.34, 0.34, 0.34, 0.34], 0.0)
rng = np.random.default_rng(0)
for watch in (False, True):
    auto = CascadeController({"lookup": LookupDrafter()}, curve, 8, CascadeConfig(base_len=10**9))
    if not watch:
        auto.watched = []
    auto.begin()
    ctx = list(rng.integers(0, 2000, 300))
    t = 0.0
    n = 2000
    for i in range(n):
        ctx.append(int(ctx[rng.integers(0, len(ctx))]) if i % 3 else int(rng.integers(0, 2000)))
        t0 = time.perf_counter()
        auto.choose(ctx, 64)
        auto.record(1, 0.04, 0, 0)
        t += time.perf_counter() - t0
    print(f"watch={watch}: {t / n * 1e6:.0f} us per plain iteration")
