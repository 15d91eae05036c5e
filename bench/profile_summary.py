"""Prints what global_profiler wrote (docs/configuration.md, "Profiling"): per profiled call its wall and busy
seconds, operator calls (kernels on a GPU) and named phases; with --ops, the operators a call ran counted by name
from its Chrome trace (top-level calls and all), which shows where an operator count comes from.

    python3 bench/profile_summary.py PROFILE_DIR [--step N] [--ops METHOD] [--top 25] [--json]
"""
import argparse
import collections
import glob
import gzip
import json
import os
import sys


def summaries(root, step=None):
    """Every summary line under root (a save_path or one step_<N> directory), in file order."""
    pattern = os.path.join(root, "step_*", "*.summary.jsonl")
    if os.path.basename(os.path.normpath(root)).startswith("step_"):
        pattern = os.path.join(root, "*.summary.jsonl")
    out = []
    for path in sorted(glob.glob(pattern)):
        for line in open(path):
            if line.strip():
                record = json.loads(line)
                if step is None or record["step"] == step:
                    out.append(record)
    return out


def load_trace(path):
    opener = gzip.open if path.endswith(".gz") else open
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path, opener = path + ".gz", gzip.open
    with opener(path, "rt") as f:
        return json.load(f)


def operator_counts(trace):
    """Host operators by name: (calls, top-level calls, total host seconds of top-level calls). Top level: not
    inside another operator on the same thread (a phase, a user scope, does not count as an operator)."""
    ops = [e for e in trace.get("traceEvents", []) if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    ops.sort(key=lambda e: (e.get("tid"), e["ts"], -e.get("dur", 0)))
    counts = collections.defaultdict(lambda: [0, 0, 0.0])
    open_until = {}
    for e in ops:
        end = e["ts"] + e.get("dur", 0)
        tid = e.get("tid")
        top = e["ts"] >= open_until.get(tid, -1)
        c = counts[e["name"]]
        c[0] += 1
        if top:
            c[1] += 1
            c[2] += e.get("dur", 0) * 1e-6
            open_until[tid] = end
    return counts


def print_call(r):
    cuda = r.get("device") == "cuda"
    kernels = f", {r['kernels']} kernels, {r['kernel_launches']} launches" if cuda else ""
    print(f"step {r['step']} {r['role']} rank {r['rank']} {r['method']} #{r['call']}: {r['wall_s']:.4f} s wall, "
          f"{r['busy_s']:.4f} s {'device' if cuda else 'host'} busy ({r['busy_ratio']:.2f}), "
          f"{r['operator_calls']} operator calls{kernels}")
    scopes = sorted(r.get("scopes", {}).items(), key=lambda kv: -kv[1]["host_s"])
    for name, s in scopes:
        device = f", device {s['device_s']:.4f} s, {s['kernels']:.0f} kernels" if "device_s" in s else ""
        print(f"    {name:32s} {s['calls']:6.0f} x  host {s['host_s']:.4f} s, "
              f"{s.get('operator_calls', 0):.0f} operator calls{device}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="global_profiler.save_path (or one of its step_<N> directories)")
    p.add_argument("--step", type=int, help="only this step")
    p.add_argument("--ops", metavar="METHOD", help="count the operators of this method's calls from their traces")
    p.add_argument("--top", type=int, default=25, help="operators listed with --ops")
    p.add_argument("--json", action="store_true", help="the summary lines as JSON, one per call")
    args = p.parse_args()
    records = summaries(args.dir, args.step)
    if not records:
        sys.exit(f"profile_summary: no summary lines under {args.dir}"
                 + (f" for step {args.step}" if args.step else ""))
    for r in records:
        if args.json:
            print(json.dumps(r))
        else:
            print_call(r)
        if args.ops and r["method"] == args.ops:
            counts = operator_counts(load_trace(r["trace"]))
            total = sum(c[0] for c in counts.values())
            top_level = sum(c[1] for c in counts.values())
            print(f"  operators: {total} calls, {top_level} top-level; by top-level calls:")
            for name, (calls, top, seconds) in sorted(counts.items(), key=lambda kv: -kv[1][1])[:args.top]:
                print(f"    {name:40s} {top:7d} top-level {calls:7d} in all  {seconds:.4f} s")


if __name__ == "__main__":
    main()
