import subprocess
import sys


def test_web_tier_never_imports_the_heavy_libraries():
    code = ("import sys, funnel.web.app, funnel.web.server, funnel.web.pipeline, funnel.web.transport.front; "
            "heavy = {'torch', 'transformers', 'onnxruntime'} & set(sys.modules); "
            "sys.exit(f'imported {heavy}' if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout
