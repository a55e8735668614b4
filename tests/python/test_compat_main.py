"""`python -m torchdefer`: the installation's version, its torch, and what the C++ library runs."""

import os
import subprocess
import sys

import torch
import torchdefer


def run_main(**env):
    result = subprocess.run(
        [sys.executable, "-m", "torchdefer"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stderr
    return dict(
        (label.strip(), value.strip())
        for label, value in (line.split(":", 1) for line in result.stdout.splitlines())
    )


def test_it_prints_the_version_the_torch_and_where_it_was_imported_from():
    info = run_main()
    assert info["torchdefer"] == torchdefer.__version__
    assert info["location"] == os.path.dirname(os.path.abspath(torchdefer.__file__))
    assert info["built against torch"] == torch.__version__.split("+")[0]
    assert info["running torch"] == torch.__version__
    # The CUDA counter fill is linked only when the build's torch has CUDA (Note [CUDA counter
    # fill build]).
    assert info["CUDA kernels"] in (("yes", "no") if torch.version.cuda else ("no",))
    assert info["CUDA available"] == ("yes" if torch.cuda.is_available() else "no")


def test_the_cpu_capability_is_the_counter_fills_and_follows_its_cap():
    best = run_main()["counter fill CPU capability"]
    assert best in ("avx512", "avx2", "scalar")
    assert run_main(TORCHDEFER_CPU_CAPABILITY="scalar")["counter fill CPU capability"] == "scalar"
    capped = run_main(TORCHDEFER_CPU_CAPABILITY="avx2")["counter fill CPU capability"]
    assert capped == ("scalar" if best == "scalar" else "avx2")


def test_the_version_is_the_projects():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "CMakeLists.txt")) as f:
        assert f"project(torchdefer VERSION {torchdefer.__version__} " in f.read()
