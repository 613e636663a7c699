import subprocess
import sys


def test_web_tier_never_imports_the_heavy_libraries():
    code = ("import sys, web.app, web.server, web.gateway; "
            "heavy = {'torch', 'transformers', 'onnxruntime'} & set(sys.modules); "
            "sys.exit(f'imported {heavy}' if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout
