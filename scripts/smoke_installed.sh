#!/usr/bin/env bash
# Smoke test of an installed vlret (scripts/check_package.sh), run from a folder outside the
# source tree so that only the installed package is importable.
#   smoke_installed.sh core VENV REPO   the wheel without extras: the core imports, no harness
#                                       dependency pulled in, a harness command names its extra
#   smoke_installed.sh full VENV REPO   the wheel with [train,vsl]: --version, configs, the quick
#                                       demo, a short training run from a shipped config
set -euo pipefail
mode=$1
venv=$(cd "$2" && pwd)
repo=$(cd "$3" && pwd)
py=$venv/bin/python
vlret=$venv/bin/vlret
case "$PWD/" in
  "$repo"/*) echo "smoke: run from outside the source tree ($repo)" >&2; exit 1 ;;
esac
export PYTHONNOUSERSITE=1
unset PYTHONPATH
start=$SECONDS
say() { echo "-- smoke $mode [$((SECONDS - start)) s]: $*"; }

say "import the installed package"
"$py" - "$venv" "$repo" <<'EOF'
import sys
from pathlib import Path

import vlret
import vlret.losses
import vlret.memory
import vlret.metrics
import vlret.similarity

where = Path(vlret.__file__).resolve()
assert where.is_relative_to(Path(sys.argv[1]).resolve()), f"vlret imported from {where}"
if (Path(sys.argv[2]) / "src/vlret/py.typed").is_file():
    assert (where.parent / "py.typed").is_file(), "the installed package lacks py.typed"
print(f"vlret {vlret.__version__} from {where.parent}")
EOF

if [ "$mode" = core ]; then
  say "the core install pulls in no harness dependency"
  "$py" - <<'EOF'
import importlib.util
import sys

import vlret  # noqa: F401

present = [m for m in ("yaml", "tqdm", "sklearn", "scipy") if importlib.util.find_spec(m)]
assert not present, f"installed without any extra: {present}"
harness = [m for m in ("yaml", "tqdm", "sklearn", "scipy") if m in sys.modules]
assert not harness, f"import vlret imported {harness}"
EOF
  "$vlret" --version
  say "a harness command names the extra it needs"
  set +e
  err=$("$vlret" train vsepp_butd_f30k_unified 2>&1 >/dev/null)
  status=$?
  set -e
  echo "$err"
  if [ "$status" -ne 2 ] || [ "$err" != "vlret train needs PyYAML: pip install 'vlret[train]'" ]; then
    echo "smoke: expected one line naming vlret[train] and status 2, got status $status" >&2
    exit 1
  fi
  say "core OK"
  exit 0
fi

say "vlret --version"
"$vlret" --version
say "vlret configs"
count=$("$vlret" configs | tee configs.txt | grep -c '^[a-z0-9_]\+  ')
tracked=$(git -C "$repo" ls-files 'src/vlret/configs/*.toml' | wc -l)
tail -1 configs.txt
if [ "$count" -ne "$tracked" ]; then
  echo "smoke: vlret configs lists $count configs, the source tree has $tracked" >&2
  exit 1
fi
"$vlret" configs show vsepp_butd_f30k_unified | head -3
"$vlret" configs copy vsepp_butd_f30k_unified cfg
[ -f cfg/vsepp_butd_f30k_unified.toml ] || { echo "smoke: configs copy wrote nothing" >&2; exit 1; }

say "vlret demo (the quick tour)"
"$vlret" demo | tail -2

say "vlret synth tiny, then a short training run from a shipped config"
"$vlret" synth tiny --out world | tee synth.txt
hint=$(grep '^train on it: ' synth.txt | sed 's/^train on it: //')
read -ra cmd <<<"$hint"
if [ "${cmd[0]:-}" != vlret ] || [ "${cmd[1]:-}" != train ]; then
  echo "smoke: no 'train on it: vlret train ...' hint from vlret synth" >&2
  exit 1
fi
# The hint names the config by its source-checkout path (configs/NAME.toml): the installed
# package resolves it to the shipped file.
"$vlret" "${cmd[@]:1}" --set output_dir=run --set train.epochs=1 \
  --set train.max_steps_per_epoch=5 --set train.batch_size=32 --set train.progress=false
for f in config.yaml last.pt best.pt metrics.jsonl; do
  [ -f "run/$f" ] || { echo "smoke: the run folder lacks $f" >&2; exit 1; }
done
say "full OK"
