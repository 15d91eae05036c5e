"""The table of scripts/async_curves.sh: one row per run of the staleness sweep.

Usage: python3 scripts/async_curves_table.py RUN_DIR EVAL_EVERY NAME...
Reads RUN_DIR/curves/NAME/{metrics.jsonl,checkpoints/step_*/heldout.txt}, NAME.log (the held-out score
before training) and RUN_DIR/plan.json (the planner's seconds per step by staleness).
"""
import json
import os
import re
import statistics
import sys


def heldout_before(log_path):
    match = re.search(r"held-out score \(greedy\): before ([0-9.]+)", open(log_path).read())
    return float(match.group(1)) if match else float("nan")


def heldout_at(run_dir, step):
    path = os.path.join(run_dir, "checkpoints", f"step_{step}", "heldout.txt")
    if not os.path.exists(path):
        return float("nan")
    return float(re.search(r"mean score ([0-9.]+)", open(path).read()).group(1))


def run_row(out, name, every):
    run_dir = os.path.join(out, "curves", name)
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    rows = [r for r in rows if r["step"] > 0]  # step 0: the validation before training
    step_s = [r["timing/step_s"] for r in rows]
    elapsed = [sum(step_s[: i + 1]) for i in range(len(step_s))]
    # Staleness of the trained tokens: per token with partial rollouts, else every token of a sequence
    # has the version that began it.
    stale_mean = [r.get("rollout/token_staleness_mean", r.get("rollout/staleness_mean", 0.0)) for r in rows]
    stale_max = [r.get("rollout/token_staleness_max", r.get("rollout/staleness_max", 0.0)) for r in rows]
    # The staleness histogram over the run: per token with partial rollouts or streamed groups, else per sample.
    shares = {}
    for d in range(0, 9):
        key = next((k for k in (f"rollout/token_staleness_share_{d}", f"rollout/staleness_share_{d}") if k in rows[-1]), None)
        if key:
            shares[d] = statistics.mean(r.get(key, 0.0) for r in rows)
    total = elapsed[-1]
    checkpoints = [(0, 0.0, heldout_before(os.path.join(out, "curves", name + ".log")))]
    for step in range(every, len(rows) + 1, every):
        checkpoints.append((step, elapsed[step - 1], heldout_at(run_dir, step)))
    steady = step_s[2:] if len(step_s) > 4 else step_s  # the first two steps warm up (and fill the buffer)
    return {
        "name": name,
        "steps": len(rows),
        "seconds": total,
        "s_per_step": statistics.mean(steady),
        "tokens_per_s": sum(r["perf/total_tokens"] for r in rows) / total,
        "response_tokens_per_s": sum(r["response_length/mean"] * 64 for r in rows) / total,
        "staleness_mean": statistics.mean(stale_mean),
        "staleness_max": max(stale_max),
        "idle": sum(r.get("timing/trainer_idle_s", 0.0) for r in rows) / total,
        "train_score_last": statistics.mean(r["score/mean"] for r in rows[-every:]),
        "resumed": sum(r.get("rollout/resumed_sequences", 0.0) for r in rows),
        "shares": shares,
        "curve": checkpoints,
        "windows": [(f"{lo}-{hi}", elapsed[min(hi, len(rows)) - 1],
                     statistics.mean(r["score/mean"] for r in rows[lo - 1:hi]))
                    for lo, hi in reward_windows(len(rows)) if lo <= len(rows)],
    }


def reward_windows(steps):
    """Step ranges for the training reward: fine early, where the reward climbs, coarse later."""
    edges = [0, 5, 10, 20, 30, 50] + list(range(100, steps + 1, 50))
    edges = [e for e in edges if e < steps] + [steps]
    return [(lo + 1, hi) for lo, hi in zip(edges, edges[1:])]


def planned_s_per_step(out):
    path = os.path.join(out, "plan.json")
    if not os.path.exists(path):
        return {}
    plan = json.load(open(path))
    return {p["staleness"]: p["iteration_s"] for p in plan.get("async", {}).get("by_staleness", [])}


def main():
    out, every, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    staleness = {n: int(re.match(r"s(\d)", n).group(1)) for n in names}
    runs = [run_row(out, n, every) for n in names]
    planned = planned_s_per_step(out)
    base = next((r for r in runs if r["name"] == "s0"), runs[0])

    print("held-out greedy exact match (200 problems) @ seconds of training (evaluation excluded), by step")
    steps = [c[0] for c in base["curve"]]
    print(f"{'run':<9}" + "".join(f"{'step ' + str(s):>16}" for s in steps))
    for r in runs:
        cells = [f"{score:.3f} @ {sec:5.0f}s" for _, sec, score in r["curve"]]
        print(f"{r['name']:<9}" + "".join(f"{c:>16}" for c in cells))

    print()
    print("training reward (exact match of the batch's 64 samples), mean over each column's steps @ seconds at the "
          "column's last step")
    print(f"{'run':<9}" + "".join(f"{'steps ' + w[0]:>15}" for w in base["windows"]))
    for r in runs:
        print(f"{r['name']:<9}" + "".join(f"{score:.3f} @ {sec:4.0f}s".rjust(15) for _, sec, score in r["windows"]))

    print()
    print(f"{'run':<9}{'k':>2}{'partial':>8}{'s':>7}{'s/step':>8}{'tok/s':>7}{'resp tok/s':>11}"
          f"{'stale mean/max':>15}{'idle':>6}{'resumed':>8}{'train score':>12}"
          f"{'speed-up':>9}{'planned s/step':>15}{'planned speed-up':>17}")
    for r in runs:
        k = staleness[r["name"]]
        speedup = base["s_per_step"] / r["s_per_step"]
        plan_s = planned.get(k, float("nan"))
        plan_speedup = planned.get(0, float("nan")) / plan_s if k in planned else float("nan")
        print(f"{r['name']:<9}{k:>2}{'yes' if r['name'].endswith('p') else 'no':>8}{r['seconds']:>7.0f}"
              f"{r['s_per_step']:>8.3f}{r['tokens_per_s']:>7.0f}{r['response_tokens_per_s']:>11.0f}"
              f"{r['staleness_mean']:>10.2f} / {r['staleness_max']:.0f}{r['idle']:>6.0%}{r['resumed']:>8.0f}"
              f"{r['train_score_last']:>12.3f}{speedup:>8.2f}x{plan_s:>15.3f}{plan_speedup:>16.2f}x")
    print()
    print("staleness histogram: share of the trained samples begun 0, 1, 2, ... updates before the policy trained "
          "(of the tokens drawn so, with partial rollouts or streamed groups), over all steps")
    for r in runs:
        if not r["shares"] and staleness[r["name"]] == 0:
            r["shares"] = {0: 1.0}  # on-policy records carry no histogram: every sample is of the policy trained
    most = max((max(r["shares"]) for r in runs if r["shares"]), default=0)
    print(f"{'run':<9}" + "".join(f"{d:>7}" for d in range(most + 1)))
    for r in runs:
        print(f"{r['name']:<9}" + "".join(f"{r['shares'][d]:>7.1%}" if d in r["shares"] else f"{'-':>7}"
                                          for d in range(most + 1)))
    print()
    print("s: seconds of the run's steps (evaluation and checkpoints excluded); s/step: mean after the first two "
          "steps; tok/s: prompt + response tokens trained per second; idle: the trainer's share of the time spent "
          "waiting for rollouts and weight syncs; train score: mean training reward of the last "
          f"{every} steps; speed-up: s/step of {base['name']} over the run's")


if __name__ == "__main__":
    main()
