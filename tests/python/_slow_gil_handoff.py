"""Runs a script with a long GIL switch interval: ``python _slow_gil_handoff.py SCRIPT ARGS...``.

A thread that asks for the GIL waits up to half a second for it instead of 5 ms, so a native
thread that still needs it when the main thread finishes (Gloo's, dropping a finished collective)
reaches interpreter shutdown, and aborts the process, in most runs rather than one in thirty.
"""

import os
import runpy
import sys

sys.setswitchinterval(0.5)
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
