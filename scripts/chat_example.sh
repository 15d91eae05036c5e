#!/usr/bin/env bash
# GRPO on verl-format data with a published tokenizer and its chat template, end to end on a laptop:
# writes addition questions as verl parquet (chat messages, reward_model.ground_truth), makes a small
# Qwen3-architecture model over Qwen3's tokenizer (embedding padded to a multiple of 128, as Qwen pads it),
# fine-tunes it on the chat-formatted data, then trains it with GRPO from the parquet files.
#   HF_TOKENIZER=dir   a directory with tokenizer.json + tokenizer_config.json (with a chat_template);
#                      default: the Qwen3 files in ../shared/testdata
# Extra arguments are overrides for the GRPO stage (e.g. trainer.total_steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh hybridflow
export OMP_WAIT_POLICY=passive
hf=${HF_BUILD_DIR:-build}/hybridflow
run=${HF_RUN_DIR:-runs/chat}
tokenizer=${HF_TOKENIZER:-../shared/testdata/tokenizers/qwen3}
[ -f "$tokenizer/tokenizer.json" ] || { echo "chat_example: no tokenizer.json in $tokenizer (set HF_TOKENIZER)" >&2; exit 1; }
rm -rf "$run"

echo "== 1. verl-format parquet: 1-digit addition as chat questions"
"$hf" data --task addition --format parquet --min-digits 1 --max-digits 1 --train-size 80 --test-size 20 \
    --out "$run/data"

echo "== 2. a small Qwen3-architecture model over $tokenizer"
"$hf" init --tokenizer "$tokenizer" --preset qwen3-tiny --vocab-multiple 128 --seed 0 --out "$run/init"

echo "== 3. supervised fine-tuning on the chat-formatted questions"
"$hf" sft --config examples/sft_chat_addition.yaml model.path="$run/init" trainer.out_dir="$run/sft" \
    data.train_file="$run/data/train.parquet" data.test_file="$run/data/test.parquet"

echo "== 4. GRPO from the parquet files, rewards from reward_model.ground_truth"
"$hf" train --config examples/grpo_chat_addition.yaml model.path="$run/sft/final" trainer.run_dir="$run/grpo" \
    data.train_file="$run/data/train.parquet" data.test_file="$run/data/test.parquet" "$@"
