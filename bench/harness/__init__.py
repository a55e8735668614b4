"""The peak-memory and time benchmark of model initialization strategies.

run.py       the driver: python3 -m bench.harness.run --help
strategy.py  the Python strategies, one per process (the C++ ones: bench/strategy_main.cpp)
plan.py      the strategies and the memory estimate that decides what fits this machine
models.py    the Llama shapes, as torch.nn and transformers models
report.py    JSON, Markdown, plot, machine description, Google Benchmark table
distributed.py  per-rank memory and time under DTensor layouts (FSDP2, FSDP2 x TP) over Gloo
init_speed.py   counter-mode materialize_module against eager init, per init function and a Llama
"""
