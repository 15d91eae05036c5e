"""GRPO with hybridflow against TRL's GRPOTrainer on the same work (bench/grpo_vs_trl.sh runs it).

Both train the same model directory (written by `hybridflow init`, loaded by transformers for TRL) on the
same prompts of the built-in addition task, with the same reward (exact match of the answer, whitespace
stripped: hybridflow's task rule, written here in Python for TRL), group size, prompt and response lengths,
number of steps, threads, dtype (fp32), sampling (temperature 1, no top-k / top-p), optimizer (AdamW, betas
0.9 / 0.999, constant learning rate, gradient clipping 1.0, no weight decay), one optimizer step per RL step,
no KL term (TRL's default beta 0; hybridflow without use_kl_loss and use_kl_in_reward) and token-mean loss
(TRL's default "dapo" normalisation). hybridflow runs three ways: micro-batches of rows (padded), by token
count (verl's use_dynamic_bsz), and by token count without recomputing the old log-probs (verl's
rollout_correction.bypass_mode, the rollout's log-probs instead: TRL with one iteration recomputes none).
Prints seconds per step and generated tokens per second of each, and their ratios: medians over the timed
steps (the first `--warmup` are not timed), since on a shared machine bursts of load only ever add time;
and CPU seconds per step (every process and thread of each side, so the other jobs of a shared machine
hardly matter): TRL's from its process per step, hybridflow's as the difference between a run of the
warm-up steps alone and the full run.

What still differs:
- processes: hybridflow runs its controller and one worker process (the controller mostly waits); TRL one;
- generation: hybridflow's engine drops finished rows from the batch; TRL calls transformers' generate(),
  whose rows keep computing until the batch's longest sample ends;
- random draws: the two sample with their own generators, so the responses differ (from the same
  distribution: the mean length is printed);
- micro-batches: hybridflow runs `--micro` rows per forward/backward (the same gradient, token-weighted),
  TRL all samples at once;
- AdamW: libtorch's against torch's (same hyperparameters);
- hybridflow scores held-out prompts greedily before and after training (outside the timed steps: in
  "wall s" only), TRL does not.
"""

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time

from hf_tokenizer import load_hybridflow_tokenizer


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hybridflow", default="build/hybridflow", help="the hybridflow binary")
    p.add_argument("--out", default="runs/bench_grpo_vs_trl", help="work directory (model, prompts, runs)")
    p.add_argument("--preset", default="small", help="hybridflow init --preset (tiny 0.8M, small 3.4M, base)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO's group, rollout.n)")
    p.add_argument("--response-length", type=int, default=32, help="most generated tokens per sample")
    p.add_argument("--max-digits", type=int, default=3, help="addition operands of 1 to this many digits")
    p.add_argument("--steps", type=int, default=8, help="RL steps (optimizer steps) of each run")
    p.add_argument("--warmup", type=int, default=1, help="first steps not timed")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads of each run")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1,
                   help="run each side this many times, alternating, and keep each side's fastest run (on a shared "
                        "machine the noise only ever adds time)")
    p.add_argument("--micro", type=int, default=16,
                   help="hybridflow's rows per micro-batch (0: the step's samples, as TRL's one per-device batch); "
                        "with dynamic batch size the token budget is that many rows at the batch's full width")
    p.add_argument("--hf-set", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra hybridflow override (repeatable), after the script's own: e.g. "
                        "actor_rollout_ref.rollout.free_cache_engine=false keeps the KV pools and CUDA graphs "
                        "between rollouts")
    p.add_argument("--skip-padded", action="store_true",
                   help="run hybridflow only with dynamic batch size (not also with padded micro-batches)")
    p.add_argument("--model", help="train this model directory (a transformers one: config.json, safetensors, "
                                   "tokenizer.json) instead of a fresh `hybridflow init --preset`")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both sides train")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: hybridflow's bf16 actor with fp32 master weights; TRL loads the model in bf16 with "
                        "bf16=True")
    p.add_argument("--trl-micro", type=int, default=0,
                   help="TRL's per-device batch (its micro-batch; the step's samples are generated at once and "
                        "accumulated over step samples / this); 0 = the step's samples")
    p.add_argument("--sides", default="trl,padded,dynamic,bypass",
                   help="which runs, comma-separated: trl, padded, dynamic, bypass (hybridflow by token count "
                        "without recomputed old log-probs)")
    p.add_argument("--no-cpu-time", action="store_true",
                   help="skip the run of the warm-up steps alone that hybridflow's CPU seconds per step need")
    p.add_argument("--profile-step", type=int, default=0,
                   help="hybridflow's sides: profile this step's actor calls (old log-probs and update) with "
                        "global_profiler (docs/configuration.md, \"Profiling\") and print each call's summary, as "
                        "JSON lines too; that step's time carries the profiler's cost")
    p.add_argument("--profile-trace", action=argparse.BooleanOptionalAction, default=True,
                   help="with --profile-step: also write each profiled call's Chrome trace (a real-size update's "
                        "is hundreds of MB)")
    p.add_argument("--trl-worker", help=argparse.SUPPRESS)  # internal: run the TRL side in this process
    return p.parse_args()


def addition_prompts(count, max_digits, seed):
    """Prompts of the built-in addition task ("12+345=" -> "357"), drawn here so both runs read one file."""
    rng = random.Random(seed)

    def number():
        digits = rng.randint(1, max_digits)
        first = rng.randint(0 if digits == 1 else 1, 9)
        return int(str(first) + "".join(str(rng.randint(0, 9)) for _ in range(digits - 1)))

    rows = []
    for _ in range(count):
        a, b = number(), number()
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


def mean(values):
    return sum(values) / len(values) if values else float("nan")


def timed_figures(seconds, tokens):
    """Seconds per step and tokens/s of the timed steps: medians, since on a shared machine bursts of load
    from other jobs only ever add time to some steps."""
    return {"step_s": statistics.median(seconds),
            "tokens_per_s": statistics.median([t / s for t, s in zip(tokens, seconds)]),
            "mean_step_s": mean(seconds)}


# ---------------------------------------------------------------------------------------------- hybridflow


def run_hybridflow(args, model_dir, prompt_file, dynamic, longest_prompt, bypass=False):
    label = ("dynamic bsz" if dynamic else "padded") + (", bypass" if bypass else "")
    run_dir = os.path.join(args.out, "hybridflow_" + label.replace(" ", "_").replace(",", ""))
    shutil.rmtree(run_dir, ignore_errors=True)
    samples = args.prompts * args.group
    micro = args.micro if args.micro > 0 else samples
    overrides = [
        f"model.path={model_dir}",
        "data.task=addition",
        f"data.train_file={prompt_file}",
        f"data.test_file={prompt_file}",
        "data.shuffle=false",
        "data.add_bos=false",  # TRL tokenizes prompts without special tokens
        f"data.train_batch_size={args.prompts}",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",  # TRL's scale_rewards "group"
        "algorithm.use_kl_in_reward=false",
        f"actor_rollout_ref.rollout.n={args.group}",
        f"actor_rollout_ref.rollout.response_length={args.response_length}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_k=0",
        "actor_rollout_ref.rollout.top_p=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",  # one optimizer step per RL step
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.shuffle=false",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.grad_clip=1.0",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        f"actor_rollout_ref.actor.use_dynamic_bsz={'true' if dynamic else 'false'}",
        # TRL does not recompute the old policy's log-probs either (one iteration: it takes the current ones).
        f"algorithm.rollout_correction.bypass_mode={'true' if bypass else 'false'}",
        # A padded micro-batch's size in tokens: the same memory at most.
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={micro * (longest_prompt + args.response_length)}",
        f"trainer.seed={args.seed + 1}",
        f"trainer.threads_per_worker={args.threads}",
        "trainer.test_freq=0",
        "trainer.log_samples_freq=0",
        "trainer.logger=[jsonl]",
        f"trainer.run_dir={run_dir}",
        "trainer.resume_mode=disable",
        f"trainer.device={args.device}",
    ]
    if args.dtype == "bf16":
        overrides.append("actor_rollout_ref.actor.dtype=bf16")
    for setting in args.hf_set:
        if "=" not in setting:
            raise SystemExit(f"--hf-set {setting!r}: expected KEY=VALUE")
        overrides.append(setting)
    profile_dir = os.path.join(run_dir, "profile")
    if args.profile_step > 0:
        overrides += ["global_profiler.tool=torch", f"global_profiler.steps=[{args.profile_step}]",
                      f"global_profiler.save_path={profile_dir}", f"global_profiler.trace={str(args.profile_trace).lower()}",
                      "actor_rollout_ref.actor.profiler.enable=true",
                      "actor_rollout_ref.actor.profiler.ranks=[0]"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="passive")

    def train(steps):
        """CPU seconds of the whole process tree (controller and workers), wall seconds, per-step metrics."""
        shutil.rmtree(run_dir, ignore_errors=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([args.hybridflow, "train", *overrides, f"trainer.total_steps={steps}"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
        return cpu, wall, [r for r in records if r["step"] > 0]  # step 0: the validation before training

    # CPU time per step by difference: a run of the warm-up steps only and the full run share start-up and the
    # held-out scoring, so the difference is the timed steps' own work, whatever else loads the machine.
    cpu_warmup, _, _ = (0.0, 0.0, []) if args.no_cpu_time else train(args.warmup)
    cpu, wall, steps = train(args.steps)
    if args.profile_step > 0:
        report_profile(profile_dir, args.profile_step, label)
    timed = steps[args.warmup:]
    seconds = [s["timing/step_s"] for s in timed]
    tokens = [s["response_length/mean"] * samples for s in timed]
    stages = {stage: statistics.median([s.get(f"timing/{stage}_s", 0.0) for s in timed])
              for stage in ("generate", "old_log_prob", "update_actor")}
    return {
        "name": f"hybridflow ({label})",
        "stages": stages,
        **timed_figures(seconds, tokens),
        "cpu_step_s": float("nan") if args.no_cpu_time else (cpu - cpu_warmup) / len(timed),
        "mean_response": mean([s["response_length/mean"] for s in timed]),
        "score": mean([s["score/mean"] for s in steps]),
        "wall_s": wall,
        # CUDA graphs (a GPU): captured per timed step; none after the first with free_cache_engine false.
        **({"decode_graphs_captured": mean([s["rollout/decode_graphs_captured"] for s in timed])}
           if all("rollout/decode_graphs_captured" in s for s in timed) and timed else {}),
    }


def report_profile(profile_dir, step, label):
    """The profiled step's calls: a summary each (bench/profile_summary.py), and a JSON line each."""
    import profile_summary  # beside this script
    records = profile_summary.summaries(profile_dir, step)
    if not records:
        print(f"hybridflow ({label}): no profile of step {step} under {profile_dir}", flush=True)
        return
    for r in records:
        profile_summary.print_call(r)
        print(json.dumps({"what": "grpo profile", "side_label": label, **r}), flush=True)


# ------------------------------------------------------------------------------------------------- TRL


def grpo_config_kwargs(config_class, wanted):
    """The GRPOConfig arguments this TRL release accepts, with checkpointing off (hybridflow's is off; TRL has
    turned it on by default under one name or another: gradient_checkpointing, activation_checkpointing).
    Fields a release lacks are dropped with a note, so one script runs against the GPU image's TRL and this
    machine's."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config_class)}
    kwargs = dict(wanted)
    for name in ("gradient_checkpointing", "activation_checkpointing"):
        if name in fields:
            kwargs[name] = False
    dropped = sorted(k for k in kwargs if k not in fields)
    if dropped:
        print(f"trl: this GRPOConfig has no {', '.join(dropped)}; left at its defaults", flush=True)
    return {k: v for k, v in kwargs.items() if k in fields}


def trl_worker(config_path):
    """The TRL side, in its own process (its own threads, no hybridflow state)."""
    cfg = json.load(open(config_path))
    import torch

    torch.set_num_threads(cfg["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = load_hybridflow_tokenizer(cfg["model"])
    tokenizer.padding_side = "left"
    bf16 = cfg["dtype"] == "bf16"
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.bfloat16 if bf16 else torch.float32)
    rows = [json.loads(line) for line in open(cfg["prompts"])]
    dataset = Dataset.from_list(rows)

    def exact_match(completions, answer, **kwargs):
        # hybridflow's task rule: 1 when the response, surrounding whitespace removed, is the answer.
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin, self.cpu_begin, self.seconds, self.cpu_seconds, self.logs = None, None, [], [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin, self.cpu_begin = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.begin)
            self.cpu_seconds.append(time.process_time() - self.cpu_begin)  # every thread of the process

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.logs.append(dict(logs))

    samples = cfg["prompts_per_step"] * cfg["group"]
    micro = cfg["micro"] or samples
    if samples % micro:
        raise SystemExit(f"--trl-micro ({micro}) must divide the step's samples ({samples})")
    wanted = dict(
        output_dir=os.path.join(cfg["out"], "trl_run"),
        use_cpu=cfg["device"] == "cpu",
        bf16=bf16,
        fp16=False,
        seed=cfg["seed"],
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=samples // micro,
        num_generations=cfg["group"],
        # One generation of the step's samples, one optimizer step over them per RL step.
        steps_per_generation=samples // micro,
        num_iterations=1,
        max_completion_length=cfg["response_length"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dapo",  # token-mean over the batch
        scale_rewards="group",
        epsilon=0.2,
        learning_rate=cfg["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        max_steps=cfg["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        shuffle_dataset=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    config = GRPOConfig(**grpo_config_kwargs(GRPOConfig, wanted))
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    json.dump({"seconds": timer.seconds, "cpu_seconds": timer.cpu_seconds, "logs": timer.logs}, open(cfg["result"], "w"))


def run_trl(args, model_dir, prompt_file):
    cfg = {"model": model_dir, "prompts": prompt_file, "out": args.out, "threads": args.threads, "seed": args.seed,
           "prompts_per_step": args.prompts, "group": args.group, "response_length": args.response_length,
           "lr": args.lr, "steps": args.steps, "result": os.path.join(args.out, "trl_result.json"),
           "device": args.device, "dtype": args.dtype, "micro": args.trl_micro}
    config_path = os.path.join(args.out, "trl_config.json")
    json.dump(cfg, open(config_path, "w"))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="passive", TOKENIZERS_PARALLELISM="false")
    start = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--trl-worker", config_path], check=True, env=env)
    wall = time.perf_counter() - start
    result = json.load(open(cfg["result"]))
    samples = args.prompts * args.group
    seconds = result["seconds"][args.warmup:]
    logs = result["logs"][args.warmup:]
    if len(logs) != len(seconds):
        raise SystemExit(f"TRL logged {len(result['logs'])} steps with completion lengths, timed {len(result['seconds'])}")
    tokens = [log["completions/mean_length"] * samples for log in logs]
    return {
        "name": "TRL GRPOTrainer",
        **timed_figures(seconds, tokens),
        "cpu_step_s": mean(result["cpu_seconds"][args.warmup:]),
        "mean_response": mean([log["completions/mean_length"] for log in logs]),
        "score": mean([log.get("rewards/exact_match/mean", log.get("reward", float("nan"))) for log in result["logs"]]),
        "wall_s": wall,
    }


# ------------------------------------------------------------------------------------------------- main


def main():
    args = parse_args()
    if args.trl_worker:
        trl_worker(args.trl_worker)
        return 0
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    os.makedirs(args.out, exist_ok=True)
    model_dir = args.model or os.path.join(args.out, "model")
    if not args.model:
        subprocess.run([args.hybridflow, "init", "--preset", args.preset, "--task", "addition", "--seed", str(args.seed),
                        "--out", model_dir], check=True, stdout=subprocess.DEVNULL)
    prompt_file = os.path.join(args.out, "prompts.jsonl")
    rows = addition_prompts(args.prompts * args.steps, args.max_digits, args.seed)
    with open(prompt_file, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    # One token per character with the task's tokenizer, at most that with a subword one: a bound either way.
    longest_prompt = max(len(row["prompt"]) for row in rows)
    print(f"GRPO, {args.model or args.preset + ' preset'}, {args.dtype} on {args.device}, {args.threads} threads: "
          f"{args.steps} steps ({args.warmup} warm-up, not timed) of {args.prompts} prompts x {args.group} samples, "
          f"at most {args.response_length} tokens", flush=True)
    chosen = args.sides.split(",")
    if args.skip_padded and "padded" in chosen:
        chosen.remove("padded")
    runners = {"trl": lambda: run_trl(args, model_dir, prompt_file),
               "padded": lambda: run_hybridflow(args, model_dir, prompt_file, False, longest_prompt),
               "dynamic": lambda: run_hybridflow(args, model_dir, prompt_file, True, longest_prompt),
               "bypass": lambda: run_hybridflow(args, model_dir, prompt_file, True, longest_prompt, bypass=True)}
    unknown = [c for c in chosen if c not in runners]
    if unknown or not chosen:
        raise SystemExit(f"--sides: expected any of trl, padded, dynamic, bypass; got {args.sides}")
    runs = {c: [] for c in chosen}
    failed = []
    for _ in range(args.repeat):
        for c in chosen:  # in the order given: a run cut short by the caller keeps the sides done before
            try:
                r = runners[c]()
            except (subprocess.CalledProcessError, OSError, json.JSONDecodeError) as e:
                print(f"{c}: failed ({e}); the other sides go on", flush=True)
                failed.append(c)
                continue
            runs[c].append(r)
            print(json.dumps({"side": c, "prompts": args.prompts, "group": args.group,
                              "response_length": args.response_length, "steps": args.steps, "warmup": args.warmup,
                              **r}), flush=True)
    results = [max(side_runs, key=lambda r: r["tokens_per_s"]) for side_runs in runs.values() if side_runs]
    for r, side_runs in zip(results, [v for v in runs.values() if v]):
        r["runs_tokens_per_s"] = [round(x["tokens_per_s"], 1) for x in side_runs]
        r["tokens_per_cpu_s"] = r["mean_response"] * args.prompts * args.group / r["cpu_step_s"]
    trl = next((r for r in results if r["name"].startswith("TRL")), None)
    nan = float("nan")
    print(f"{'run':<36} {'s/step':>7} {'tokens/s':>9} {'CPU s/step':>10} {'tokens/CPU-s':>12} {'mean len':>8} "
          f"{'score':>6} {'x TRL tokens/s':>14} {'x TRL s/step':>12} {'x TRL tokens/CPU-s':>18}")
    for r in results:
        print(f"{r['name']:<36} {r['step_s']:7.3f} {r['tokens_per_s']:9.1f} {r['cpu_step_s']:10.3f} "
              f"{r['tokens_per_cpu_s']:12.1f} {r['mean_response']:8.2f} {r['score']:6.3f} "
              f"{r['tokens_per_s'] / trl['tokens_per_s'] if trl else nan:14.2f} "
              f"{trl['step_s'] / r['step_s'] if trl else nan:12.2f} "
              f"{r['tokens_per_cpu_s'] / trl['tokens_per_cpu_s'] if trl else nan:18.2f}")
    for r in results:
        if "stages" in r:
            print(f"{r['name']}: per step (medians) " + ", ".join(f"{k} {v:.3f} s" for k, v in r["stages"].items()))
        if args.repeat > 1:
            print(f"{r['name']}: tokens/s of each run {r['runs_tokens_per_s']}")
    print(json.dumps({"results": results}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
