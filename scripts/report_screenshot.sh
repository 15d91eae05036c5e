#!/usr/bin/env bash
# Renders the HTML run report of RUN_DIR to a PNG with headless Chromium, to look at a report without a
# browser (and to make docs/report.png).
#   scripts/report_screenshot.sh RUN_DIR OUT.png
#   HF_REPORT=path        the report tool (default build/hf_report, built with scripts/build.sh hf_report_cli)
#   HF_SCREENSHOT_SIZE    window size WIDTH,HEIGHT (default 1400,3000); the PNG is the window, not the page
# Chromium is not part of scripts/setup.sh: install it with `apt-get install -y chromium` (Debian).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 RUN_DIR OUT.png" >&2
  exit 2
fi
run_dir=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
  echo "report_screenshot: no chromium found; install it with: apt-get install -y chromium" >&2
  exit 1
fi
report_tool=${HF_REPORT:-$root/build/hf_report}
if [ ! -x "$report_tool" ]; then
  echo "report_screenshot: building hf_report (plain C++, no libtorch)" >&2
  HF_BUILD_JOBS=${HF_BUILD_JOBS:-1} bash "$root/scripts/build.sh" hf_report_cli >&2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$report_tool" "$run_dir" "$tmp/report.html"
out_abs=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
# Its own profile directory, so it neither reads nor writes the user's; no GPU in a headless container.
"$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$tmp/profile" \
  --window-size="${HF_SCREENSHOT_SIZE:-1400,3000}" --screenshot="$out_abs" "file://$tmp/report.html" 2>"$tmp/chromium.log" ||
  { cat "$tmp/chromium.log" >&2; exit 1; }
[ -s "$out_abs" ] || { cat "$tmp/chromium.log" >&2; echo "report_screenshot: no screenshot written" >&2; exit 1; }
echo "report_screenshot: $out"
