"""Counter-mode fill throughput on a CUDA device next to torch's own fills of the same buffer.

    PYTHONPATH=build/python python3 bench/gpu_fill.py [--mib 512] [--json out.json]

Each counter row materializes one parameter of --mib MiB with rng="counter" on the GPU (the
kernel of replay/src/cuda/counter_fill.cu, plus the allocation the caching allocator reuses) and
reports bytes written per second, the median of --reps runs. The torch rows time `fill_`
(the write-bandwidth ceiling), `uniform_` and `normal_` on a buffer of the same size with CUDA
events. docs/benchmarks.md's GPU section shows a run's table.
"""

import argparse
import json
import statistics
import time

import torch
import torchdefer

DISTRIBUTIONS = {
    "uniform": lambda t: t.uniform_(-1.0, 1.0),
    "normal": lambda t: t.normal_(0.0, 0.02),
    "trunc_normal": lambda t: torch.nn.init.trunc_normal_(t, std=0.02),
    "bernoulli": lambda t: t.bernoulli_(0.5),
    "exponential": lambda t: t.exponential_(1.0),
    "random": lambda t: t.random_(0, 100),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


class Holder(torch.nn.Module):
    def __init__(self, numel, dtype, init):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(numel, dtype=dtype), requires_grad=False)
        init(self.weight.data)


def counter_seconds(numel, dtype, init, reps):
    times = []
    for _ in range(reps + 1):
        module = torchdefer.deferred_init(Holder, numel, dtype, init)
        torch.cuda.synchronize()
        start = time.perf_counter()
        torchdefer.materialize_module(module, device="cuda", rng="counter")
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        del module
    return statistics.median(times[1:])


def torch_seconds(numel, dtype, op, reps):
    t = torch.empty(numel, dtype=dtype, device="cuda")
    op(t)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        op(t)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of " + ", ".join(DTYPES))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    print(f"{device}, {args.mib} MiB per buffer, torch {torch.__version__}")
    print("| fill | dtype | GB/s |\n|---|---|---|", flush=True)
    rows = []

    def add(row):
        rows.append(row)
        print(f"| {row['what']} | {row['dtype']} | {row['gb_per_s']:.0f} |", flush=True)

    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        numel = args.mib * 2**20 // torch.tensor([], dtype=dtype).element_size()
        nbytes = numel * torch.tensor([], dtype=dtype).element_size()
        for name, op in [("torch fill_", lambda t: t.fill_(1)), ("torch uniform_", lambda t: t.uniform_()),
                         ("torch normal_", lambda t: t.normal_())]:
            add({"what": name, "dtype": dname, "gb_per_s": nbytes / torch_seconds(numel, dtype, op, args.reps) / 1e9})
        for name, init in DISTRIBUTIONS.items():
            if dtype == torch.float64 and name == "random":
                continue
            seconds = counter_seconds(numel, dtype, init, args.reps)
            add({"what": f"counter {name}", "dtype": dname, "gb_per_s": nbytes / seconds / 1e9})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "mib": args.mib, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
