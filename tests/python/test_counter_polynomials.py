"""replay/src/counter_math.h's erfinv polynomials are the ones scripts/counter_polynomials.py
computes (Note [Counter scheme versions]): a hand edit of a coefficient is caught."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "counter_polynomials.py"
HEADER = ROOT / "replay" / "src" / "counter_math.h"


def check(header):
    return subprocess.run([sys.executable, str(SCRIPT), "--check", "--header", str(header)],
                          capture_output=True, text=True)


def test_the_header_holds_the_generated_polynomials():
    result = check(HEADER)
    assert result.returncode == 0, result.stderr


def test_a_changed_coefficient_fails_the_check(tmp_path):
    text = HEADER.read_text()
    start = text.index("// BEGIN generated")
    coefficient = text.index("0x1.", start)
    edited = tmp_path / "counter_math.h"
    edited.write_text(text[:coefficient] + "0x1.0" + text[coefficient + len("0x1."):])
    result = check(edited)
    assert result.returncode == 1 and "differs" in result.stderr
