# session 55 call F: how much GPU memory the > 2^31-element staged-backward check needs, by state count
import gc, sys
sys.path.insert(0, "tests")
import jax
import test_cuda_selective_scan as t
dev = jax.devices()[0]
print("limit GiB", dev.memory_stats()["bytes_limit"] / 2**30)
for n in [int(a) for a in sys.argv[1:]]:
    try:
        errs = t._far_end_gradients((1 << 26) + 37, dstate=n)
        print("dstate", n, "errors u, delta, B, C", ["%.2e" % e for e in errs], "tol", t.GRAD_TOL[t.BF16],
              "peak GiB %.1f" % (dev.memory_stats()["peak_bytes_in_use"] / 2**30))
    except Exception as e:
        print("dstate", n, "failed:", str(e).splitlines()[0][:220])
    gc.collect(); jax.clear_caches()
