"""The table of scripts/gpu_bench.sh: every figure of results.jsonl as a ratio to its bound (measured in the same
run) or to its peer, next to the issue's target, and each cell's status (ok, failed, out of time, skipped).
Prints markdown and writes it to --out. Works on partial results: a missing figure reads "n/a".

Bounds: decode at batch 1 against the weight bytes over the copy bandwidth; at larger batches against the step's
roofline, max((weight bytes + KV cache bytes) / bandwidth, FLOPs / matmul peak), counted as roofline.h counts
them (matmul weights incl. a tied head, scores and mixing over the context); training against the bf16 matmul
peak with hybridflow's own FLOP count (6 x parameters + attention per token: model FLOPs, no recomputation).
Decode cells: "decode SHAPE" (hybridflow), "decode SHAPE VARIANT" (hybridflow with extra flags), "decode SHAPE
peer" (transformers); a missed decode target cites the profile of the same shape and batch ("profile SHAPE",
`bench generate --profile`), which gets a section of its own.
"""

import argparse
import json
import os


def load(path):
    rows = []
    if os.path.exists(path):
        for line in open(path):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


class Shape:
    """What the roofline needs from a model directory's config.json."""

    def __init__(self, config):
        c = config
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.hidden = c["hidden_size"]
        self.head_dim = c.get("head_dim") or self.hidden // self.heads
        self.matmul_params = (self.layers * (self.hidden * self.heads * self.head_dim * 2
                                             + 2 * self.hidden * self.kv_heads * self.head_dim
                                             + 3 * self.hidden * c["intermediate_size"])
                              + c["vocab_size"] * self.hidden)
        self.weight_bytes = 2 * self.matmul_params  # bf16
        self.kv_bytes_per_token = 2 * self.layers * self.kv_heads * self.head_dim * 2

    def forward_flops(self, context):
        return 2 * self.matmul_params + 4 * self.layers * self.heads * self.head_dim * context

    def decode_bound(self, batch, context, bandwidth, peak):
        """Tokens/s of the step's roofline at `batch` rows attending over `context` keys."""
        seconds = max((self.weight_bytes + batch * context * self.kv_bytes_per_token) / bandwidth,
                      batch * self.forward_flops(context) / peak)
        return batch / seconds


def fmt(x, digits=3):
    if x is None:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def ratio(a, b):
    return a / b if a is not None and b else None


def verdict(value, target):
    if value is None:
        return "not measured"
    return "met" if value >= target else f"missed ({value / target:.2f} of it)"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--results", required=True)
    p.add_argument("--status", required=True)
    p.add_argument("--models", required=True, help="the folder of the model directories (one per shape)")
    p.add_argument("--out", required=True)
    p.add_argument("--decode-context", type=float, required=True)
    p.add_argument("--title", default="hybridflow")
    p.add_argument("--sizes", default="", help="a sentence of the cells' sizes, printed under the bounds")
    args = p.parse_args()
    rows = load(args.results)
    by_cell = {}
    for r in rows:
        by_cell.setdefault(r["cell_name"], []).append(r)
    bounds = next((r for r in rows if r.get("cell") == "bounds"), None)
    bandwidth = bounds["hbm_gb_s"] * 1e9 if bounds else None
    peak = bounds["matmul_tflops"] * 1e12 if bounds else None

    def shape_of(name):
        path = os.path.join(args.models, name, "config.json")
        return Shape(json.load(open(path))) if os.path.exists(path) else None

    lines = [f"## {args.title}", ""]
    if bounds:
        lines.append(f"Bounds measured in this run on {bounds['device']}: device copy {fmt(bounds['hbm_gb_s'])} GB/s "
                     f"(bytes read + written, {bounds['copy_mb']} MiB), bf16 GEMM {fmt(bounds['matmul_tflops'])} TFLOP/s "
                     f"({bounds['gemm']}^3, random data); torch {bounds['torch']}.")
        lines.append("")
    if args.sizes:
        lines += [f"Sizes: {args.sizes}", ""]
    lines += ["| cell | hybridflow | bound | x bound | peer | x peer | target | |",
              "|---|---|---|---|---|---|---|---|"]

    def row(cell, ours, bound, of_bound, peer, of_peer, target, met):
        lines.append(f"| {cell} | {ours} | {bound} | {fmt(of_bound, 2)} | {peer} | {fmt(of_peer, 2)} | {target} | {met} |")

    # The profiles: per shape (and variant), per batch, the decode-profile lines of `bench generate --profile`.
    profiles = {}  # (cell key, "decode profile" | "train profile", batch): the line
    for cell_name, records in by_cell.items():
        if cell_name.startswith("profile "):
            for r in records:
                if r.get("what") in ("decode profile", "train profile"):
                    profiles[(cell_name[len("profile "):], r["what"], r["batch"])] = r

    def profile_note(key, batch):
        prof = profiles.get((key, "decode profile", batch))
        if not prof:
            return ""
        return (f"profile: {prof['busy_kind']} busy {prof['busy_ratio']:.2f} of the step's wall time, "
                f"{prof['kernels_per_step']:.0f} kernels and {prof['operator_calls_per_step']:.0f} operator calls a step")

    decode_keys = {n[len("decode "):] for n in by_cell if n.startswith("decode ") and not n.endswith(" peer")}
    decode_keys |= {n[len("decode "):-len(" peer")] for n in by_cell if n.startswith("decode ") and n.endswith(" peer")}
    for key in sorted(decode_keys, key=lambda k: (k.split()[0], len(k)), reverse=False):
        name = key.split()[0]
        shape = shape_of(name)
        ours = {r["batch"]: r for r in by_cell.get(f"decode {key}", []) if r.get("what") == "decode"}
        peer = {r["batch"]: r for r in by_cell.get(f"decode {name} peer", []) if r.get("cell") == "hf-decode"}
        for batch in sorted(set(ours) | set(peer)):
            if key != name and batch not in ours:
                continue  # a variant's rows: only where it measured
            tps = ours[batch]["tokens_per_s"] if batch in ours else None
            peer_tps = peer[batch]["decode_tokens_per_s"] if batch in peer else None
            bound = None
            if shape and bandwidth:
                bound = (bandwidth / shape.weight_bytes if batch == 1
                         else shape.decode_bound(batch, args.decode_context, bandwidth, peak))
            kind = "weight bytes / bandwidth" if batch == 1 else "step roofline"
            target, goal = ("", None)
            if name.endswith("1.7b") and batch in (1, 256):
                target, goal = ">= 0.5 x bound", 0.5
            size = ours.get(batch) or peer.get(batch) or {}
            tokens = (f", {size.get('prompt_length')} + {size.get('new_tokens')} tokens"
                      if size.get("prompt_length") else "")
            met = verdict(ratio(tps, bound), goal) if goal else ""
            if met.startswith("missed") or (not goal and tps is not None):
                met = "; ".join(x for x in (met, profile_note(key, batch)) if x)
            row(f"decode {key}, batch {batch}{tokens} (tokens/s)", fmt(tps), f"{fmt(bound)} ({kind})",
                ratio(tps, bound), f"{fmt(peer_tps)} (transformers)", ratio(tps, peer_tps), target, met)
        # Prefill, apart from decode on both sides: hybridflow's at its largest batch, the peer's at that batch.
        pre = next((r for r in by_cell.get(f"decode {key}", []) if r.get("what") == "prefill"), None)
        if pre:
            peer_pre = peer.get(pre["batch"], {}).get("prefill_tokens_per_s")
            row(f"prefill {key}, batch {pre['batch']} x {pre.get('prompt_length')} tokens (tokens/s)",
                fmt(pre["tokens_per_s"]), "", None, f"{fmt(peer_pre)} (transformers)",
                ratio(pre["tokens_per_s"], peer_pre), "", "")

    for name in sorted({n.split()[1] for n in by_cell if n.startswith("train ")}):
        for what in ("train", "update dynamic bsz", "train checkpointed"):
            # The last such line: a cell the second call ran again after the first cut it short.
            r = next((x for x in reversed(by_cell[f"train {name}"]) if x.get("what") == what), None)
            label = {"train": "train step", "train checkpointed": "train step, activation checkpointing",
                     "update dynamic bsz": "RL update, packed micro-batches"}[what]
            if r and "seq" in r:
                label += f", {r['batch']} x {r['seq']} tokens"
            if r and "max_token_len" in r:
                label += f" of at most {r['max_token_len']} tokens ({r['micro_batches']} for {r['batch']} rows)"
            flops = r["achieved"] * 1e9 if r else None
            mfu = ratio(flops, peak)
            first = what == "train"
            row(f"{label}, {name} (tokens/s)", fmt(r["tokens_per_s"] if r else None),
                f"{fmt(peak / 1e12 if peak else None)} TFLOP/s (bf16 GEMM)", mfu, "", None,
                ">= 0.40 MFU" if first else "", verdict(mfu, 0.40) if first else "")

    for name in sorted({n.split()[1] for n in by_cell if n.startswith("grpo ")}):
        sides = {r["side"]: r for r in by_cell.get(f"grpo {name}", []) + by_cell.get(f"grpo {name} peer", [])
                 if "side" in r}
        ours, trl = sides.get("dynamic"), sides.get("trl")
        speedup = ratio(trl["step_s"], ours["step_s"]) if ours and trl else None
        stages = ", ".join(f"{k} {v:.2f}" for k, v in ours["stages"].items()) if ours else ""
        if ours and "decode_graphs_captured" in ours:
            stages += f"; {ours['decode_graphs_captured']:g} CUDA graphs captured a step"
        any_side = ours or trl or {}
        size = (f"{any_side['prompts']} x {any_side['group']}, up to {any_side['response_length']} tokens, "
                if "prompts" in any_side else "")
        row(f"GRPO step {name}, {size}s/step ({stages})", fmt(ours["step_s"] if ours else None), "", None,
            f"{fmt(trl['step_s'] if trl else None)} (TRL GRPOTrainer)", speedup, ">= 5x TRL", verdict(speedup, 5.0))

    # The GRPO update under the trainer's profiler (global_profiler): its phases' time, beside the old log-probs'.
    for cell_name, records in sorted(by_cell.items()):
        if not cell_name.startswith("profile grpo "):
            continue
        calls = {r["method"]: r for r in records if r.get("what") == "grpo profile"}
        for method in ("update_actor", "compute_log_prob"):
            r = calls.get(method)
            if not r:
                continue
            busy = "device" if r.get("device") == "cuda" else "host"
            kernels = f", {r['kernels']} kernels" if "kernels" in r else ""
            phases = sorted(r.get("scopes", {}).items(), key=lambda kv: -kv[1].get("device_s", kv[1]["host_s"]))
            phase_text = "; ".join(f"{name[4:] if name.startswith('hf::') else name} {s['host_s']:.2f} s"
                                   + (f" (device {s['device_s']:.2f})" if "device_s" in s else "")
                                   for name, s in phases if name != "hf::train_step")
            row(f"profile, {cell_name[len('profile grpo '):]} GRPO {method} (step {r['step']})",
                f"{r['wall_s']:.2f} s", f"{busy} busy {r['busy_s']:.2f} s", ratio(r["busy_s"], r["wall_s"]), "", None,
                f"{r['operator_calls']} operator calls{kernels}", phase_text)

    rollout_keys = {n[len("rollout "):] for n in by_cell if n.startswith("rollout ") and not n.endswith(" peer")}
    for key in sorted(rollout_keys, key=len):
        name = key.split()[0]
        ours = next((r for r in by_cell.get(f"rollout {key}", []) if r.get("what") == "rollout"), None)
        peer = next((r for r in by_cell.get(f"rollout {name} peer", []) if r.get("cell") == "hf-rollout"), None)
        x = ratio(ours["tokens_per_s"] if ours else None, peer["tokens_per_s"] if peer else None)
        lengths = (f"mean length {fmt(ours['mean_length'] if ours else None)} / "
                   f"{fmt(peer['mean_length'] if peer else None)}")
        if ours and "prefills" in ours:
            lengths += f"; {ours['prefills']} prefills, {ours['decode_steps']} decode steps"
        sized = ours or peer
        size = (f"{sized['prompts']} x {sized['samples']} up to "
                f"{sized.get('max_new_tokens')} tokens, " if sized else "")
        row(f"rollout {key}, {size}tokens/s ({lengths})", fmt(ours["tokens_per_s"] if ours else None), "", None,
            f"{fmt(peer['tokens_per_s'] if peer else None)} (transformers)", x, ">= 5x transformers",
            verdict(x, 5.0))
        # The next rollout on the pools and graphs the first kept (bench --kept-pools): an RL run's steady state.
        kept = next((r for r in by_cell.get(f"rollout {key}", []) if r.get("what") == "rollout kept pools"), None)
        if kept:
            x = ratio(kept["tokens_per_s"], peer["tokens_per_s"] if peer else None)
            graphs = (f", {kept.get('graphs_captured', 0)} of {kept['decode_graphs']} graphs captured again"
                      if "decode_graphs" in kept else "")
            row(f"rollout {key}, the next rollout on the kept KV pools{graphs} "
                f"({kept.get('speedup_vs_first', 0):.2f}x the first)", fmt(kept["tokens_per_s"]), "", None,
                f"{fmt(peer['tokens_per_s'] if peer else None)} (transformers)", x, ">= 5x transformers",
                verdict(x, 5.0))

    if profiles:
        lines += ["", "Profiles (Kineto; decode: per decode step, the run of 1 + steps new tokens less the run of 1; "
                  "train: one step of forward, backward and AdamW; wall time includes the profiler's overhead):", "",
                  "| profile | batch | steps | wall ms | busy ms | busy / wall | operator calls | kernels | launches "
                  "| top operators by self time (ms a step) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for (key, what, batch), r in sorted(profiles.items()):
            top = ", ".join(f"{t['name']} {t['self_ms']:.2f}" for t in r.get("top", [])[:5])
            label = key if key.split()[0] == what.split()[0] else f"{what.split()[0]} {key}"
            if what == "decode profile" and "graph_steps" in r:
                label += (f" ({r['graph_steps']} of {r['steps']} steps replayed as CUDA graphs)" if r["graph_steps"]
                          else " (eager steps)")
            lines.append(f"| {label} | {batch} | {r['steps']} | {fmt(r['wall_ms_per_step'])} | "
                         f"{fmt(r['busy_ms_per_step'])} ({r['busy_kind']}) | {fmt(r['busy_ratio'], 2)} | "
                         f"{fmt(r['operator_calls_per_step'])} | {fmt(r['kernels_per_step'])} | "
                         f"{fmt(r['launches_per_step'])} | {top} |")

    lines += ["", "| step | status | seconds |", "|---|---|---|"]
    if os.path.exists(args.status):
        for line in open(args.status):
            parts = line.rstrip("\n").split("|")
            if len(parts) == 3:
                lines.append(f"| {parts[0]} | {parts[1]} | {parts[2]} |")
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
