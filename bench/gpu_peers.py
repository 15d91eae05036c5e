"""The Python half of scripts/gpu_bench.sh: the device's bounds, the model directories both sides load, and the
transformers peer of the decode and rollout cells. Each subcommand prints one JSON object per line.

  bounds       HBM bandwidth (a device-to-device copy, bytes read + written) and the bf16 matmul peak (one large
               GEMM on random data): medians of timed repeats after warm-ups.
  make-model   Qwen3-shaped model directories (one per --shape, in one process) with random weights
               (transformers' own initialisation) in bf16, with the published Qwen3 tokenizer: hybridflow
               (`bench --model`, `train`) and the peers load them.
  hf-decode    transformers' generate() with a static KV cache and SDPA: decode tokens/s at each batch, measured
               as hybridflow's `bench generate` does: one warm-up run of 1 new token, then --reps rounds of a run
               of 1 new token (the prefill) and a run of N, the fastest of each; decode = batch x (N - 1) / (the
               difference), prefill = batch x prompt / (the 1-token run); every row decodes every step, no stop
               token.
  hf-rollout   generate() on the rollout cell's work: prompts of P/2..P random tokens, n samples each at
               temperature 1, every k-th token id a stop token (as `bench generate --stop-every k`); useful tokens
               (each sample's up to and including its stop) per second.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

import torch

# The published architectures (config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B); tiny: the CPU smoke run.
SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072),
    "qwen3-1.7b": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=6144),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128),
}


def emit(record):
    print(json.dumps(record), flush=True)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, warmup, reps):
    """Median seconds of `reps` calls after `warmup`, the device drained around each."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def cmd_bounds(args):
    device = torch.device(args.device)
    n = args.copy_mb * 1024 * 1024 // 2
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src), device, 3, 10)
    assert torch.equal(dst, src), "device copy is wrong"
    del src, dst
    m = args.gemm
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    gemm_s = timed(lambda: a @ b, device, 3, 10)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    emit({"cell": "bounds", "device": name, "hbm_gb_s": 2 * n * 2 / copy_s / 1e9, "copy_mb": args.copy_mb,
          "matmul_tflops": 2 * m ** 3 / gemm_s / 1e12, "gemm": m, "torch": torch.__version__})


def cmd_make_model(args):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    device = torch.device(args.device)
    for shape in args.shape:  # one process for every shape: the imports and device start-up are paid once
        out = os.path.join(args.out, shape)
        config = Qwen3Config(vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                             rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=151643,
                             eos_token_id=151645, hidden_act="silu", attention_bias=False, **SHAPES[shape])
        torch.manual_seed(0)
        start = time.perf_counter()
        with device:
            model = Qwen3ForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(out)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer, name), os.path.join(out, name))
        emit({"cell": "make-model", "shape": shape, "parameters": sum(p.numel() for p in model.parameters()),
              "seconds": time.perf_counter() - start, "out": out})
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def load_model(path, device):
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device)
    model.eval()
    return model


def generate_kwargs(max_new_tokens, **extra):
    # The static KV cache without torch.compile: compiling each batch shape would cost minutes of the lease.
    return dict(max_new_tokens=max_new_tokens, cache_implementation="static", disable_compile=True, **extra)


def cmd_hf_decode(args):
    device = torch.device(args.device)
    model = load_model(args.model, device)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    for batch in [int(b) for b in args.batch.split(",")]:
        ids = torch.randint(3, vocab, (batch, args.prompt_length), generator=gen).to(device)
        mask = torch.ones_like(ids)

        def run(new_tokens):
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=mask,
                               **generate_kwargs(new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                                 eos_token_id=None, pad_token_id=0))

        # As hybridflow's measure_decode: a warm-up at this batch, then the two lengths in alternation (a load
        # that comes and goes hits both alike), the fastest of each.
        timed(lambda: run(1), device, 0, 1)
        prefill_s = whole_s = float("inf")
        for _ in range(args.reps):
            prefill_s = min(prefill_s, timed(lambda: run(1), device, 0, 1))
            whole_s = min(whole_s, timed(lambda: run(args.new_tokens), device, 0, 1))
        emit({"cell": "hf-decode", "batch": batch, "prompt_length": args.prompt_length, "new_tokens": args.new_tokens,
              "reps": args.reps,
              "decode_tokens_per_s": batch * (args.new_tokens - 1) / max(whole_s - prefill_s, 1e-9),
              "prefill_tokens_per_s": batch * args.prompt_length / prefill_s, "seconds": whole_s})
        del ids, mask
        if device.type == "cuda":
            torch.cuda.empty_cache()


def cmd_hf_rollout(args):
    device = torch.device(args.device)
    model = load_model(args.model, device)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(2)
    lengths = torch.randint(max(1, args.prompt_length // 2), args.prompt_length + 1, (args.prompts,), generator=gen)
    ids = torch.zeros(args.prompts, args.prompt_length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths.tolist()):  # left padded, as generate() expects for a decoder
        ids[i, args.prompt_length - n:] = torch.randint(3, vocab, (n,), generator=gen)
        mask[i, args.prompt_length - n:] = 1
    ids, mask = ids.to(device), mask.to(device)
    stop_ids = list(range(3, vocab, args.stop_every))
    stop = torch.tensor(stop_ids, device=device)
    out = None

    def run():
        nonlocal out
        torch.manual_seed(3)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask,
                                 **generate_kwargs(args.max_new_tokens, do_sample=True, temperature=1.0, top_k=0,
                                                   top_p=1.0, num_return_sequences=args.samples,
                                                   eos_token_id=stop_ids, pad_token_id=0))

    seconds = timed(run, device, 0, 1)
    responses = out[:, args.prompt_length:]
    # Each sample's tokens up to and including its first stop token (generate pads the rest).
    is_stop = torch.isin(responses, stop)
    first_stop = torch.where(is_stop.any(1), is_stop.int().argmax(1) + 1, torch.full_like(is_stop[:, 0], responses.size(1), dtype=torch.long))
    tokens = first_stop.sum().item()
    rows = responses.size(0)
    emit({"cell": "hf-rollout", "prompts": args.prompts, "samples": args.samples, "rows": rows,
          "max_new_tokens": args.max_new_tokens, "seconds": seconds, "tokens": tokens,
          "tokens_per_s": tokens / seconds, "mean_length": tokens / rows, "max_length": int(first_stop.max().item()),
          "steps_run": responses.size(1), "prompt_tokens": int(lengths.sum().item())})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for the smoke run")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bounds")
    b.add_argument("--copy-mb", type=int, default=2048, help="MiB copied (read, and as much written)")
    b.add_argument("--gemm", type=int, default=8192, help="the square bf16 GEMM's size")
    m = sub.add_parser("make-model")
    m.add_argument("--shape", choices=sorted(SHAPES), required=True, action="append",
                   help="repeatable: one directory per shape")
    m.add_argument("--out", required=True, help="the folder of the model directories (OUT/SHAPE)")
    m.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json and tokenizer_config.json")
    d = sub.add_parser("hf-decode")
    d.add_argument("--batch", default="1,64,256", help="comma-separated batch sizes")
    d.add_argument("--prompt-length", type=int, default=960)
    d.add_argument("--new-tokens", type=int, default=64)
    d.add_argument("--reps", type=int, default=2, help="timed rounds of the two lengths (the fastest counts)")
    r = sub.add_parser("hf-rollout")
    r.add_argument("--prompts", type=int, default=64)
    r.add_argument("--samples", type=int, default=8)
    r.add_argument("--prompt-length", type=int, default=128)
    r.add_argument("--max-new-tokens", type=int, default=1024)
    r.add_argument("--stop-every", type=int, default=256)
    for s in (d, r):
        s.add_argument("--model", required=True)
        s.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    args = p.parse_args()
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    {"bounds": cmd_bounds, "make-model": cmd_make_model, "hf-decode": cmd_hf_decode,
     "hf-rollout": cmd_hf_rollout}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
