#!/usr/bin/env python3
"""Fills a run directory with what the HTML report can show, for docs/report.png and for trying the report.

  scripts/make_demo_run.py RUN_DIR

Keeps a metrics.jsonl that is already there (e.g. a copy of runs/quickstart/ppo/metrics.jsonl) and writes a
plausible 300-step PPO one otherwise. Then adds what hybridflow's trainer does not write yet, marked as
illustration: samples.jsonl (addition prompts, as in the quickstart) and timeline.jsonl (the last steps'
calls per worker pool, laid out from the step's own timing/<stage>_s metrics, one stage after another as in a
colocated run). Standard library only.
"""
import json
import math
import os
import random
import sys

STAGES = [("actor_rollout", "generate"), ("reward", "reward"), ("actor_rollout", "old_log_prob"),
          ("critic", "values"), ("driver", "advantage"), ("critic", "update_critic"),
          ("actor_rollout", "update_actor")]


def synthetic_metrics(steps=300):
    rng = random.Random(0)
    rows = []
    for step in range(1, steps + 1):
        p = 0.35 + 0.55 * (1 - math.exp(-step / 80))
        score = sum(rng.random() < p for _ in range(64)) / 64
        timing = {"generate": 0.9 + rng.random() * 0.2, "reward": 0.01, "old_log_prob": 0.25, "values": 0.2,
                  "advantage": 0.005, "update_critic": 0.45, "update_actor": 0.6}
        row = {"step": step, "reward/mean": score, "score/mean": score,
               "actor/entropy": 0.9 * math.exp(-step / 120) + 0.1 + rng.gauss(0, 0.02),
               "actor/ppo_kl": abs(rng.gauss(0.01, 0.005)), "actor/pg_loss": rng.gauss(0, 0.02),
               "critic/vf_loss": 0.4 * math.exp(-step / 60) + 0.05 + abs(rng.gauss(0, 0.02)),
               "response_length/mean": 12 - 6 * (1 - math.exp(-step / 100)) + rng.gauss(0, 0.3),
               "actor/lr": 1e-6 * min(1.0, step / 20), "critic/lr": 1e-5 * min(1.0, step / 20)}
        row.update({f"timing/{k}_s": v for k, v in timing.items()})
        row["timing/step_s"] = sum(timing.values())
        row["perf/throughput_tokens_per_s"] = 64 * 20 / row["timing/step_s"]
        if step % 50 == 0:
            row["val/score"] = min(1.0, p + 0.03)
        rows.append(row)
    return rows


def main():
    run_dir = sys.argv[1]
    os.makedirs(run_dir, exist_ok=True)
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(metrics_path):
        with open(metrics_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in synthetic_metrics())
    rows = [json.loads(line) for line in open(metrics_path) if line.strip()]
    rng = random.Random(1)

    with open(os.path.join(run_dir, "samples.jsonl"), "w") as f:
        for row in rows[-3:]:
            score = row.get("score/mean") or 0.5
            for _ in range(6):
                a, b = rng.randint(0, 99), rng.randint(0, 99)
                right = rng.random() < score
                answer = a + b if right else a + b + rng.choice([-10, -1, 1, 10])
                reward = 1.0 if right else 0.0
                f.write(json.dumps({"step": row["step"], "prompt": f"{a}+{b}=", "response": f"{answer}",
                                    "reward": reward, "advantage": round(reward - score, 4)}) + "\n")
        # What the report must escape: model output is arbitrary text.
        f.write(json.dumps({"step": rows[-1]["step"], "prompt": "12+7=", "response": "<script>alert('hi')</script> 19",
                            "reward": 0.0, "advantage": round(-(rows[-1].get("score/mean") or 0.5), 4)}) + "\n")

    with open(os.path.join(run_dir, "timeline.jsonl"), "w") as f:
        clock = 0.0
        for row in rows[-3:]:
            for pool, stage in STAGES:
                seconds = row.get(f"timing/{stage}_s")
                if seconds is None:
                    continue
                f.write(json.dumps({"step": row["step"], "pool": pool, "call": stage, "start_s": round(clock, 6),
                                    "end_s": round(clock + seconds, 6)}) + "\n")
                clock += seconds
            clock += 0.002  # the driver between steps


if __name__ == "__main__":
    main()
