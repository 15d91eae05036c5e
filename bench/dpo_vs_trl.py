"""DPO with hybridflow against TRL's DPOTrainer on the same work (bench/dpo_vs_trl.sh runs it); with --loss simpo or
orpo, the reference-free losses against TRL's CPOTrainer (loss_type simpo, cpo_alpha 0) and ORPOTrainer (both in
trl.experimental), where neither side has a reference model.

Both train the same model directory (written by `hybridflow init`, loaded by transformers for TRL) on the same
preference pairs (the addition task's: chosen = the right sum, rejected = the sum with one digit changed, written
once by `hybridflow dpo` and read by both), with the same loss (sigmoid, beta), batch (pairs per optimizer step, one
micro-batch), number of steps, threads, dtype (fp32) and optimizer (AdamW, betas 0.9 / 0.999, constant learning
rate, no warm-up, gradient clipping 1.0, no weight decay); the reference is the starting model, frozen, on both
sides (TRL copies the model; hybridflow loads the directory again). Prints seconds per step of each side, medians
over the timed steps (the first `--warmup` are not timed: on a shared machine bursts of load only ever add time),
pairs per second and the ratio, and each side's loss after the last step.

What still differs: TRL tokenizes prompt and responses itself (its own special-token handling); hybridflow encodes
bos + prompt and the response + eos, as its SFT and RL trainer do. TRL's concatenated forward computes the logits of
every position over the vocabulary, hybridflow the head only at the responses' positions. libtorch's AdamW against
torch's.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from hf_tokenizer import load_hybridflow_tokenizer


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hybridflow", default="build/hybridflow", help="the hybridflow binary")
    p.add_argument("--out", default="runs/bench_dpo_vs_trl", help="work directory (model, pairs, runs)")
    p.add_argument("--preset", default="small", help="hybridflow init --preset (tiny 0.8M, small 3.4M, base)")
    p.add_argument("--model", help="train this model directory instead of a fresh `hybridflow init --preset`")
    p.add_argument("--prompts", type=int, default=1000, help="training prompts (pairs_per_prompt pairs each)")
    p.add_argument("--max-digits", type=int, default=3, help="addition operands of 1 to this many digits")
    p.add_argument("--batch", type=int, default=32, help="pairs per optimizer step (one micro-batch)")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps of each run")
    p.add_argument("--warmup", type=int, default=2, help="first steps not timed")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads of each run")
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--loss", default="sigmoid", choices=["sigmoid", "simpo", "orpo"],
                   help="sigmoid: DPO against DPOTrainer; simpo / orpo: against CPOTrainer / ORPOTrainer")
    p.add_argument("--simpo-gamma", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1,
                   help="run each side this many times, alternating, and keep each side's fastest run")
    p.add_argument("--sides", default="trl,hybridflow", help="which runs, comma-separated: trl, hybridflow")
    return p.parse_args()


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def make_model_and_pairs(a):
    os.makedirs(a.out, exist_ok=True)
    model = a.model
    if not model:
        model = os.path.join(a.out, "model")
        shutil.rmtree(model, ignore_errors=True)
        run([a.hybridflow, "init", "--preset", a.preset, "--task", "addition", "--seed", str(a.seed), "--out", model])
    data_run = os.path.join(a.out, "data_run")
    shutil.rmtree(data_run, ignore_errors=True)
    # One step writes the task's pairs (data_run/data/train_pairs.jsonl); both sides read that file.
    run([a.hybridflow, "dpo", f"model.path={model}", f"data.max_digits={a.max_digits}",
         f"data.train_size={a.prompts}", "data.test_size=1", "data.pairs_per_prompt=2", "trainer.steps=1",
         "trainer.eval_every=0", f"trainer.threads={a.threads}", f"trainer.out_dir={data_run}"],
        stdout=subprocess.DEVNULL)
    return model, os.path.join(data_run, "data", "train_pairs.jsonl")


def step_seconds_of(times, warmup):
    timed = times[warmup:]
    if not timed:
        sys.exit("dpo_vs_trl: no timed steps (raise --steps above --warmup)")
    return statistics.median(timed)


def run_hybridflow(a, model, pairs, index):
    out = os.path.join(a.out, f"hybridflow_{index}")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    run([a.hybridflow, "dpo", f"model.path={model}", f"data.train_file={pairs}", "data.test_file=",
         f"dpo.beta={a.beta}", f"dpo.loss_type={a.loss}", f"dpo.simpo_gamma={a.simpo_gamma}", f"optim.lr={a.lr}", "optim.warmup_steps=0",
         "optim.schedule=constant", "optim.weight_decay=0", "optim.grad_clip=1.0", f"trainer.steps={a.steps}",
         f"trainer.batch_size={a.batch}", f"trainer.micro_batch_size={a.batch}", "trainer.eval_every=0",
         f"trainer.threads={a.threads}", f"trainer.seed={a.seed}", f"trainer.out_dir={out}"],
        env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(os.path.join(out, "dpo_metrics.jsonl"))]
    ends = [r["seconds"] for r in rows]
    times = [ends[0]] + [b - e for e, b in zip(ends, ends[1:])]
    return {"step_s": step_seconds_of(times, a.warmup), "loss": rows[-1]["loss"]}


def run_trl(a, model, pairs):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(a.threads)
    rows = [json.loads(line) for line in open(pairs)]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
                                 for r in rows])
    tokenizer = load_hybridflow_tokenizer(model)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times, self.start, self.losses = [], None, []

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])

    common = dict(output_dir=os.path.join(a.out, "trl"), beta=a.beta, learning_rate=a.lr,
                  lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
                  per_device_train_batch_size=a.batch, gradient_accumulation_steps=1, max_steps=a.steps,
                  logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False, fp16=False,
                  seed=a.seed, dataloader_num_workers=0, disable_tqdm=True)
    if a.loss == "sigmoid":
        config, trainer_class = DPOConfig(loss_type="sigmoid", **common), DPOTrainer
    elif a.loss == "simpo":
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        from trl.experimental.cpo import CPOConfig, CPOTrainer
        config = CPOConfig(loss_type="simpo", cpo_alpha=0.0, simpo_gamma=a.simpo_gamma, **common)
        trainer_class = CPOTrainer
    else:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer
        config, trainer_class = ORPOConfig(**common), ORPOTrainer
    times = StepTimes()
    trainer = trainer_class(model=policy, args=config, train_dataset=dataset, processing_class=tokenizer,
                            callbacks=[times])
    trainer.train()
    return {"step_s": step_seconds_of(times.times, a.warmup), "loss": times.losses[-1] if times.losses else float("nan")}


def main():
    a = parse_args()
    sides = [s for s in a.sides.split(",") if s]
    model, pairs = make_model_and_pairs(a)
    best = {}
    for index in range(a.repeat):
        for side in sides:
            result = run_trl(a, model, pairs) if side == "trl" else run_hybridflow(a, model, pairs, index)
            print(f"{side} run {index + 1}: {result['step_s']:.3f} s a step, loss {result['loss']:.4f}", flush=True)
            if side not in best or result["step_s"] < best[side]["step_s"]:
                best[side] = result
    print(f"\n{a.loss} loss, {a.batch} pairs a step, {a.steps} steps ({a.warmup} not timed), {a.threads} threads, fp32, "
          f"model {model}")
    print(f"{'side':<12}{'s/step':>10}{'pairs/s':>10}{'x TRL':>8}{'loss':>10}")
    for side in sides:
        r = best[side]
        ratio = best["trl"]["step_s"] / r["step_s"] if "trl" in best else float("nan")
        print(f"{side:<12}{r['step_s']:>10.3f}{a.batch / r['step_s']:>10.1f}{ratio:>8.2f}{r['loss']:>10.4f}")


if __name__ == "__main__":
    main()
