"""The benchmark harness (bench/harness/): every strategy on the tiny shape, the driver end to end
(processes, estimates, JSON, table, plot, Google Benchmark table), and the shared model shapes."""

import json
import math
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchdefer

REPO = Path(__file__).resolve().parents[2]
# BUILD/python/torchdefer/__init__.py, or for an installed torchdefer the build TORCHDEFER_BUILD_DIR names.
BUILD = Path(os.environ.get("TORCHDEFER_BUILD_DIR") or Path(torchdefer.__file__).resolve().parents[2])
FIXTURE = Path(__file__).parent / "fixtures" / "google_benchmark.json"
sys.path.insert(0, str(REPO))

from bench.harness import models, plan, report, run, strategy  # noqa: E402

TINY = models.config("tiny")


@pytest.mark.parametrize("name", [s for s in strategy.STRATEGIES if s != "py-broadcast"])
def test_python_strategy_measures_the_tiny_model(name):
    torch.manual_seed(0)
    result = strategy.run(name, TINY, rank=1, world=2, device=torch.device("cpu"))
    assert result["strategy"] == name and result["parameters"] == models.parameter_count(TINY)
    assert result["peak_rss_bytes"] >= result["baseline_rss_bytes"] > 0
    assert result["wall_s"] == pytest.approx(result["construct_s"] + result["materialize_s"])
    # The construction phase on its own, next to meta construction in the same process.
    assert result["construct_rss_bytes"] >= 0 and result["meta_rss_bytes"] >= 0
    assert result["construct_s"] > 0 and result["meta_construct_s"] > 0
    full = models.parameter_count(TINY) * 4
    sharded = name.endswith(("-eager", "-from-config", "-shard"))
    if sharded:
        # Rank 1 of 2 keeps half of every parameter (dim 0 is even for every tiny parameter).
        kept_parameters = result["bytes_kept"] - sum(b.nbytes for b in _buffers(name))
        assert kept_parameters == full // 2
        assert result["tensors_sliced"] + result["tensors_fallback"] == len(models.parameter_shapes(TINY))
    elif name.endswith("-record"):
        # The record phase alone: nothing real is kept or computed.
        assert result["bytes_kept"] == result["bytes_computed"] == 0 and result["materialize_s"] == 0
    else:
        assert result["bytes_kept"] >= full and result["tensors_sliced"] == 0


def _buffers(name):
    # A trainer's flow allocates with to_empty: its buffers are the model's, built on meta.
    name = "py-deferred-record" if name.startswith("py-flow-") else name
    with torch.device("meta"):
        module = strategy.builder(name, TINY)()
    return list(module.buffers())


def test_shapes_agree_with_the_modules_they_describe():
    with torch.device("meta"):
        shapes = sorted(tuple(p.shape) for p in models.Llama(TINY).parameters())
        hf_shapes = sorted(tuple(p.shape) for p in strategy.builder("hf-from-config", TINY)().parameters())
    assert shapes == sorted(models.parameter_shapes(TINY)) == hf_shapes
    assert plan.shard_bytes(TINY, 1) == models.parameter_count(TINY) * 4
    assert plan.shard_bytes(TINY, 3, rank=0) + plan.shard_bytes(TINY, 3, rank=1) + plan.shard_bytes(
        TINY, 3, rank=2) == models.parameter_count(TINY) * 4


def test_estimate_refuses_what_cannot_fit():
    big = models.config("llama3-405b")
    eager = plan.estimate_bytes(plan.BY_NAME["cpp-eager"], big, world=64, broadcast_world=2)
    assert eager["per_process"] > models.parameter_count(big) * 4
    assert not plan.fits(eager, available=10**12)
    shard = plan.estimate_bytes(plan.BY_NAME["cpp-deferred-shard"], TINY, world=1, broadcast_world=2)
    assert shard["per_process"] > models.parameter_count(TINY) * 4  # world 1: the shard is everything
    broadcast = plan.estimate_bytes(plan.BY_NAME["py-broadcast"], TINY, world=64, broadcast_world=4)
    assert broadcast["total"] == pytest.approx(4 * broadcast["per_process"])


def test_matrix_names_are_checked():
    cells = run.parse_matrix(["cpp-*=tiny,llama-30m", "cpp-eager=tiny"])
    assert [(s.name, c.name) for s, c in cells] == [
        ("cpp-eager", "tiny"), ("cpp-deferred-full", "tiny"), ("cpp-deferred-shard", "tiny"),
        ("cpp-eager", "llama-30m"), ("cpp-deferred-full", "llama-30m"), ("cpp-deferred-shard", "llama-30m")]
    with pytest.raises(ValueError, match="no strategy matches 'rust-\\*'"):
        run.parse_matrix(["rust-*=tiny"])
    with pytest.raises(ValueError, match="unknown Llama size 'llama-7t'"):
        run.parse_matrix(["cpp-*=llama-7t"])
    with pytest.raises(ValueError, match="STRATEGIES=MODELS"):
        run.parse_matrix(["cpp-*"])


def test_a_spec_can_give_its_cells_their_own_repetitions():
    specs = ["cpp-eager,cpp-deferred-full=tiny", "cpp-deferred-shard,cpp-eager=llama-30m,tiny:1"]
    assert [(s.name, c.name) for s, c in run.parse_matrix(specs)] == [
        ("cpp-eager", "tiny"), ("cpp-deferred-full", "tiny"), ("cpp-deferred-shard", "tiny"),
        ("cpp-deferred-shard", "llama-30m"), ("cpp-eager", "llama-30m")]
    # The first spec naming a cell decides its count; the others get --reps.
    assert run.cell_reps(specs, default=3) == {
        ("cpp-eager", "tiny"): 3, ("cpp-deferred-full", "tiny"): 3, ("cpp-deferred-shard", "tiny"): 1,
        ("cpp-deferred-shard", "llama-30m"): 1, ("cpp-eager", "llama-30m"): 1}
    for bad in ("cpp-eager=tiny:0", "cpp-eager=tiny:two"):
        with pytest.raises(ValueError, match="positive integer"):
            run.parse_matrix([bad])


def test_micro_table_renders_google_benchmark_json():
    micro = report.load_micro([str(FIXTURE)])
    text = report.micro_table(micro)
    # With repetitions, only the median aggregates are shown.
    assert "| BM_Fixture/f32/threads:1_median | 200 µs | 190 µs | 2.50 GB/s | — |" in text
    assert "| BM_Fixture/items_median | 12.5 ms | 12 ms | — | 80 |" in text
    assert "_mean" not in text and "| BM_Fixture/f32/threads:1 |" not in text


def test_driver_end_to_end(tmp_path):
    command = [sys.executable, "-m", "bench.harness.run", "--build-dir", str(BUILD), "--out", str(tmp_path),
               "--world", "2", "--reps", "2", "--micro", str(FIXTURE),
               "--run", "cpp-*,py-broadcast=tiny", "--run", "cpp-eager=llama3-405b"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["model"], r["strategy"], r["role"]): r for r in results["rows"]}
    assert set(rows) == {("tiny", "cpp-eager", ""), ("tiny", "cpp-deferred-full", ""),
                         ("tiny", "cpp-deferred-shard", ""), ("tiny", "py-broadcast", "rank 0"),
                         ("tiny", "py-broadcast", "rank 1"), ("llama3-405b", "cpp-eager", "")}
    needs = rows[("llama3-405b", "cpp-eager", "")]
    assert needs["status"] == "needs" and needs["estimate_total_bytes"] > 1.6e12 and "runs" not in needs
    for key, row in rows.items():
        if key[0] != "tiny":
            continue
        assert row["status"] == "measured" and len(row["runs"]) == 2, key
        assert row["runs"][0]["parameters"] == models.parameter_count(TINY), key  # C++ and Python agree
        peak = row["summary"]["peak_rss_bytes"]
        assert peak["min"] <= peak["median"] <= peak["max"]
        for phase in ("construct_s", "construct_rss_bytes", "meta_construct_s", "meta_rss_bytes"):
            assert row["summary"][phase]["median"] >= 0, (key, phase)  # both runners report it
    shard = rows[("tiny", "cpp-deferred-shard", "")]["runs"][0]
    assert shard["tensors_sliced"] == len(models.parameter_shapes(TINY)) and shard["tensors_fallback"] == 0
    assert results["command"].startswith("python3 -m bench.harness.run --build-dir")
    page = (tmp_path / "results.md").read_text()
    assert f"| llama3-405b | 405.85 B | cpp-eager | not run | needs {needs['estimate_total_bytes'] / 1e9:.1f} GB |" in page
    assert "## The construction phase on its own" in page
    assert "| tiny | cpp-deferred-full | " in page.split("## The construction phase on its own")[1]
    assert "BM_Fixture/items_median" in page and "![peak memory vs model size](peak_memory.png)" in page
    assert (tmp_path / "peak_memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| tiny | 107 K | cpp-deferred-shard |" in done.stdout  # the table is printed too


def test_distributed_entry_point_measures_every_way_and_gets_the_counter_model(tmp_path):
    from bench.dtensor_memory import Llama
    from bench.harness import distributed

    shape = distributed.Shape(dim=48, layers=1, heads=4, hidden=100, vocab=101)
    sizes = [f"--{name}={value}" for name, value in vars(shape).items()]
    command = [sys.executable, "-m", "bench.harness.distributed", *sizes, "--layouts", "fsdp2-w2", "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BUILD / "python"), str(REPO)]))
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(c["layout"], c["way"], c["status"]) for c in results["cells"]] == [
        ("fsdp2-w2", way, "measured") for way in ["torchdefer", "meta", "broadcast"]]
    for cell in results["cells"]:
        ranks = cell["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        # Every parameter is split between the two ranks, nothing held twice (the sizes do not divide).
        assert sum(r["local_parameter_bytes"] for r in ranks) == shape.parameters() * 4
        assert all(r["peak_rss_bytes"] >= r["baseline_rss_bytes"] > 0 and r["wall_s"] > 0 for r in ranks)
        assert ranks[1]["digest"] is None  # rank 0 hashes the all-gathered weights
    assert "record_s" in results["cells"][0]["ranks"][0] and "record_s" not in results["cells"][1]["ranks"][0]
    digests = {c["way"]: c["ranks"][0]["digest"] for c in results["cells"]}

    torch.manual_seed(0)
    counter = torchdefer.deferred_init(Llama, shape.config())
    torchdefer.materialize_module(counter, rng="counter")
    assert sum(p.numel() for p in counter.parameters()) == shape.parameters()
    assert digests["torchdefer"] == distributed.weights_digest(counter)
    torch.manual_seed(0)
    assert digests["broadcast"] == distributed.weights_digest(Llama(shape.config()))  # eager's weights

    page = (tmp_path / "results.md").read_text()
    assert page.startswith(distributed.BEGIN) and page.rstrip().endswith(distributed.END)
    assert "| FSDP2, W = 2 | torchdefer | " in page and "| FSDP2, W = 2 | broadcast | " in page
    assert "- **torchdefer**: the same weights under every layout measured (FSDP2, W = 2: A)." in page
    # bench.harness.run rewrites the page in front of the section and keeps it.
    docs = tmp_path / "benchmarks.md"
    distributed.write_section(docs, page)
    distributed.write_section(docs, page)  # replaced, not appended twice
    assert docs.read_text().count(distributed.BEGIN) == 1
    assert report.other_sections(docs) == "\n" + page


def test_hf_floor_splits_deferred_init_into_the_recording_scope_the_stand_ins_and_the_settling():
    pytest.importorskip("transformers")
    from bench.harness import hf_floor

    torch.manual_seed(0)
    out = hf_floor.measure(TINY)
    for part in ("A", "B", "C", "D", "S", "W"):
        assert out[part]["wall"] > 0 and out[part]["cpu"] >= 0
    # The Python-written torch calls (torch.nn.init.*) are counted among C's calls.
    assert 0 < out["calls_C_python"] < out["calls_C"] and out["calls_A"] < out["calls_C"]
    per_call = hf_floor.per_call(side=8)
    assert set(per_call["nn.init.normal_"]) == {"meta", "recorded, scope only", "recorded"}
    assert all(us > 0 for costs in per_call.values() for us in costs.values())


def test_the_cpp_recording_target_compares_the_medians_of_the_micro_benchmarks(tmp_path):
    def repetitions(name, times):
        runs = [dict(name=f"{name}/real_time", run_name=f"{name}/real_time", run_type="iteration",
                     repetition_index=i, real_time=t, cpu_time=t, time_unit="ms") for i, t in enumerate(times)]
        median = dict(name=f"{name}/real_time_median", run_type="aggregate", aggregate_name="median",
                      real_time=sorted(times)[len(times) // 2], cpu_time=0, time_unit="ms")
        return runs + [median]

    def row(recorded, fake):
        source = tmp_path / "micro.json"
        source.write_text(json.dumps(dict(context={}, benchmarks=repetitions(
            "BM_Record/deferred_init/llama3-70b", recorded) + repetitions("BM_Record/fake_mode/llama3-70b", fake))))
        return report.targets_table([], report.load_micro([str(source)])).splitlines()[-1]

    assert row([6.0, 9.0, 5.0], [5.0, 4.0, 6.0]) == (
        "| C++ Llama: recording (`deferred_init`) time ≤ 1.1× construction under a `FakeMode`, back to back | llama3-70b | "
        "`BM_Record/deferred_init/llama3-70b` vs `BM_Record/fake_mode/llama3-70b` | 1.20× (medians of 3 and 3 "
        "repetitions: 6 ms vs 5 ms) | no |")
    assert row([5.3, 5.4, 5.6], [5.0, 5.1, 4.9]).endswith("| 1.08× (medians of 3 and 3 repetitions: 5.4 ms vs 5 ms) | yes |")
    # Without both benchmarks there is no row.
    assert "C++ Llama" not in report.targets_table([], report.load_micro([str(FIXTURE)]))


def test_the_alternating_cpp_recording_target_is_the_median_of_the_ratio_counters(tmp_path):
    def row(ratios, beside=None):
        runs = [dict(name="BM_RecordAlternating/llama3-70b/real_time", run_type="iteration", repetition_index=i,
                     real_time=7.0, cpu_time=7.0, time_unit="ms", ratio=r) for i, r in enumerate(ratios)]
        for counter, values in (beside or {}).items():
            for run, value in zip(runs, values):
                run[counter] = value
        median = dict(name="BM_RecordAlternating/llama3-70b/real_time_median", run_type="aggregate",
                      aggregate_name="median", real_time=7.0, cpu_time=7.0, time_unit="ms", ratio=sorted(ratios)[1])
        source = tmp_path / "micro.json"
        source.write_text(json.dumps(dict(context={}, benchmarks=runs + [median])))
        return report.targets_table([], report.load_micro([str(source)])).splitlines()[-1]

    assert row([1.25, 1.19, 1.31]) == (
        "| C++ Llama: recording thread CPU ≤ 1.1× a `FakeMode` construction's, interleaved (each kind after itself "
        "and after the other) | llama3-70b | `BM_RecordAlternating/llama3-70b` | 1.25× (median of 3 repetitions' "
        "`ratio`) | no |")
    assert row([1.09, 1.02, 1.2]).endswith("| 1.09× (median of 3 repetitions' `ratio`) | yes |")
    # Its halves and the process-CPU ratio are shown beside it, and decide nothing.
    assert row([1.09, 1.02, 1.2], beside=dict(same_kind_ratio=[1.0, 1.02, 1.01], cross_ratio=[1.3, 1.14, 1.12],
                                              process_ratio=[1.2, 1.22, 1.21])).endswith(
        "| 1.09× (median of 3 repetitions' `ratio`; after its own kind 1.01×; after the other kind 1.14×; "
        "in process CPU with the generator jump 1.21×) | yes |")


def test_a_phase_that_frees_memory_it_held_at_its_start_grows_by_nothing():
    # Freeing 8 MiB that were resident when the phase started: the reset VmHWM then reads below
    # that start (Note [A reset VmHWM can read below the start] in bench/harness/strategy.py), and
    # a small model's phases, which often do not grow at all, read a negative growth and a peak
    # below the baseline whenever they happen to free more than they grow.
    held = mmap.mmap(-1, 8 << 20)
    held.write(b"\x01" * len(held))
    peak = strategy.PhasePeak()
    held.close()
    assert peak.growth() is None or peak.growth() >= 0
    assert peak.peak() >= peak.start_rss


def test_a_run_whose_port_was_taken_runs_again_on_another_port(monkeypatch):
    ports, outcomes = [], [run.RunFailed("exit status 1: ... EADDRINUSE: address already in use"),
                           [{"wall_s": 1.0}]]

    def run_on_port(strategy, config, args, port):
        ports.append(port)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(run, "run_on_port", run_on_port)
    assert run.run_once(None, None, None) == [{"wall_s": 1.0}]
    assert len(ports) == 2


def test_a_run_that_failed_for_another_reason_is_not_run_again(monkeypatch):
    calls = []

    def run_on_port(strategy, config, args, port):
        calls.append(port)
        raise run.RunFailed("exit status 1: out of memory")

    monkeypatch.setattr(run, "run_on_port", run_on_port)
    with pytest.raises(run.RunFailed, match="out of memory"):
        run.run_once(None, None, None)
    assert len(calls) == 1


def test_full_materialization_is_checked_against_eager_with_the_same_runner():
    def measured(strategy, wall_s):
        return dict(strategy=strategy, model="llama-125m", status="measured", role="", runs=[{}],
                    summary=dict(wall_s=dict(median=wall_s)))

    lines = report.targets_table([measured("cpp-eager", 0.8), measured("cpp-deferred-full", 0.36),
                                  measured("py-eager", 2.0), measured("py-deferred-full", 2.2)]).splitlines()
    assert "| cpp-deferred-full wall time ≤ 0.5× cpp-eager's | llama-125m | cpp-deferred-full | 0.45× (medians) | yes |" in lines
    assert "| py-deferred-full wall time ≤ 1.0× py-eager's | llama-125m | py-deferred-full | 1.10× (medians) | no |" in lines
    # Without its eager row there is nothing to compare with.
    assert not any("wall time ≤" in line for line in report.targets_table([measured("cpp-deferred-full", 0.36)]).splitlines())


def test_init_speed_measures_every_init_and_the_model_against_eager(tmp_path):
    from bench.harness import init_speed

    out = tmp_path / "init_speed.json"
    command = [sys.executable, "-m", "bench.harness.init_speed", "--mb", "1", "--repeats", "1", "--model", "tiny",
               "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BUILD / "python"), str(REPO)]))
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "UserWarning" not in done.stderr  # the owed generator of a recorded trunc_normal_ is reseeded away
    results = json.loads(out.read_text())
    rows = {(r["name"], r["threads"]): r for r in results["rows"]}
    assert set(rows) == {(name, threads) for name in [*init_speed.INITS, "tiny"] for threads in (1, 2)}
    for (name, _), row in rows.items():
        assert row["bytes"] == (2**20 if name != "tiny" else (models.parameter_count(TINY) + 2 * TINY.max_seq_len * TINY.head_dim // 2) * 4)
        assert all(row["best"][key] > 0 for key in ("eager_s", "counter_s", "record_s", "fresh_s", "written_fill_s"))
        assert row["speed_ratio"] == pytest.approx(row["best"]["eager_s"] / row["best"]["counter_s"])

    # The printed section: the command in the table's caption, one line per row, pass or fail each.
    page = done.stdout
    assert page.startswith(init_speed.BEGIN) and page.rstrip().endswith(init_speed.END)
    assert "*`python3 -m bench.harness.init_speed --mb 1 --repeats 1 --model tiny --json " in page
    lines = [line for line in page.splitlines() if line.startswith("| ")]
    assert lines[0] == init_speed.HEADER and len(lines) == 1 + len(rows)
    cells = [line.split(" | ") for line in lines[1:]]
    assert all(len(c) == init_speed.HEADER.count(" | ") + 1 for c in cells)
    assert [c[0] for c in cells[:2]] == ["| `uniform_(w)`"] * 2 and [c[1] for c in cells[:2]] == ["1", "2"]
    assert cells[-1][0] == "| Llama `tiny`"
    assert {c[5] for c in cells} <= {"pass", "**fail**"}
