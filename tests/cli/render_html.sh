#!/usr/bin/env bash
# Renders a failing run's HTML report in headless Chromium and checks the DOM the browser built:
# the verdict, the eight ranks of the founding case marked as dropping, no script. Skips (77)
# where no Chromium is installed (CI's Debian packages do not include it; `apt-get install
# chromium` adds it).
#   render_html.sh TALLY SEED_CASE
set -euo pipefail
tally=$1 case_file=$2
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then echo "SKIP: no headless Chromium installed"; exit 77; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$tally" run "$case_file" --html "$work/report.html" >/dev/null || true
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --user-data-dir="$work/profile" \
  --dump-dom "file://$work/report.html" 2>/dev/null >"$work/dom.html"
dropped=$(grep -o 'class="rank dropped"' "$work/dom.html" | wc -l)
if ! grep -q '<title>tally run: fail</title>' "$work/dom.html"; then
  echo "FAIL: the rendered page has no 'tally run: fail' title"; exit 1
fi
if [ "$dropped" != 8 ]; then echo "FAIL: $dropped ranks rendered as dropping, expected 8"; exit 1; fi
if grep -q '<script' "$work/dom.html"; then echo "FAIL: the rendered page holds a script"; exit 1; fi
echo "rendered in $("$browser" --version 2>/dev/null | head -1): 8 dropping ranks"
