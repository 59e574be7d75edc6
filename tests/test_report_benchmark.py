"""Benchmark results as evidence: benchmarks/attention.py --json writes a benchmark document, and `poskit report`
renders its tables where a docs page has a table=benchmark marker (report/benchmark.py)."""
import json
import re
import tarfile
from pathlib import Path

import pytest

from poskit.experiments.evidence import resolve_today
from poskit.report import markers
from poskit.report.benchmark import BenchmarkFileError, read_document
from conftest import load_benchmark

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "attention.py"
QUICK = ["--quick", "--encodings", "rope,none", "--skip-peers", "--skip-decode", "--threads", "1"]


def _attention_benchmark():
    return load_benchmark("attention")


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "docs" / "results" / "bench-x" / "benchmark.json"
    _attention_benchmark().main([*QUICK, "--json", str(path)])
    return path


def _repo(tmp_path, document_path, text):
    root = tmp_path / "repo"
    (root / "docs" / "results" / "bench-x").mkdir(parents=True)
    (root / "docs" / "results" / "bench-x" / "benchmark.json").write_bytes(document_path.read_bytes())
    (root / "docs" / "benchmarks.md").write_text(text)
    return root


def test_the_document_records_the_machine_the_command_and_every_row(document):
    doc = read_document(document)
    machine = doc["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and machine["threads"] == 1 and machine["isa"]
    assert isinstance(machine["load_average"], float) and machine["torch"].startswith("2.")
    assert doc["command"].startswith("python benchmarks/attention.py --quick --encodings rope,none")
    assert doc["command"].endswith("benchmark.json") and "/tmp" not in doc["command"]  # no machine path
    rows = doc["parts"]["attention"]["rows"]
    paths = ["RoPE+SDPA (baseline)", "rope [sdpa]", "none [sdpa]"]
    assert [(r["mode"], r["path"]) for r in rows] == [(m, p) for m in ("fwd", "fwdbwd") for p in paths]
    assert all(r["ratio"] == "1.00" for r in rows[::3]) and all(float(r["ms"]) > 0 for r in rows)
    assert set(doc["parts"]) == {"attention"}  # peers and decode were skipped
    assert doc["settings"]["shapes"] == [[2, 256]] and doc["settings"]["dtypes"] == ["fp32"]


def test_report_renders_the_table_with_its_provenance_and_check_catches_an_edit(document, tmp_path):
    root = _repo(tmp_path, document, "# b\n<!-- report: bench-x table=benchmark part=attention -->\n<!-- /report -->\n")
    outcome = markers.regenerate(root, resolve_today)
    text = outcome.files[root / "docs" / "benchmarks.md"]
    doc = json.loads(document.read_text())
    assert f"*Measured by `{doc['command']}`" in text and "instruction set" in text and "threads: 1," in text
    assert "[results](results/bench-x/benchmark.json)" in text
    baseline = doc["parts"]["attention"]["rows"][1]
    assert f"| {baseline['B']} | {baseline['T']} | fp32 | fwd | rope [sdpa] | {baseline['ms']} |" in text
    markers.write(outcome)
    assert markers.regenerate(root, resolve_today).differing == []
    edited = text.replace(f"| {baseline['ms']} |", "| 0.1 |", 1)
    (root / "docs" / "benchmarks.md").write_text(edited)
    assert [b.title for _, b in markers.regenerate(root, resolve_today).differing] == [
        "bench-x table=benchmark part=attention"]


def test_an_unknown_part_names_the_recorded_ones_and_a_missing_file_is_not_backed(document, tmp_path):
    root = _repo(tmp_path, document, "# b\n<!-- report: bench-x table=benchmark part=decode -->\n<!-- /report -->\n")
    with pytest.raises(markers.MarkerError, match=re.escape("benchmarks.md:2: part must be one of the parts the "
                                                            "benchmark recorded, ['attention'], got 'decode'")):
        markers.regenerate(root, resolve_today)
    (root / "docs" / "benchmarks.md").write_text("<!-- report: bench-y table=benchmark -->\n<!-- /report -->\n")
    text = markers.regenerate(root, resolve_today).files[root / "docs" / "benchmarks.md"]
    assert "**Not backed by a benchmark file:** docs/results/bench-y/ holds no benchmark.json" in text
    assert "`--json docs/results/bench-y/benchmark.json`" in text


def test_a_file_that_is_not_a_benchmark_document_is_refused_by_name(tmp_path):
    path = tmp_path / "benchmark.json"
    path.write_text(json.dumps({"schema": "poskit.results"}))
    with pytest.raises(BenchmarkFileError, match=re.escape(str(path)) + ": schema must be 'poskit.benchmark'"):
        read_document(path)
    path.write_text("{")
    with pytest.raises(BenchmarkFileError, match="not a readable benchmark document"):
        read_document(path)


def test_a_json_path_that_cannot_be_written_is_refused_before_measuring(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _attention_benchmark().main([*QUICK, "--json", str(tmp_path)])
    err = capsys.readouterr()
    assert "--json: " in err.err and "is a directory" in err.err
    assert "attention benchmark on" not in err.out  # nothing measured
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit):
        _attention_benchmark().main([*QUICK, "--json", str(blocker / "x" / "benchmark.json")])
    err = capsys.readouterr()
    assert "--json: its directory" in err.err and "not a directory" in err.err
    assert "attention benchmark on" not in err.out and not (blocker.parent / "x").exists()


def test_the_document_records_the_code_and_load_of_the_runs_start(tmp_path, monkeypatch):
    # a run takes minutes to hours and may outlive a commit: what it measured is the code it started with
    import poskit.report.benchmark as benchmark

    module = _attention_benchmark()
    state = {"measured": False}
    measure = module.interleaved_medians

    def measuring(*args, **kwargs):
        state["measured"] = True
        return measure(*args, **kwargs)

    monkeypatch.setattr(module, "interleaved_medians", measuring)
    monkeypatch.setattr(benchmark, "code_info",
                        lambda: {"git_commit": "after" if state["measured"] else "before", "dirty": False})
    path = tmp_path / "docs" / "results" / "bench-y" / "benchmark.json"
    module.main([*QUICK, "--json", str(path)])
    assert state["measured"]
    assert read_document(path)["code"]["git_commit"] == "before"


def test_a_copied_checkout_records_the_commit_it_is_given(tmp_path, monkeypatch):
    # a benchmark machine gets a copy of the tree: the commit comes from POSKIT_CODE_COMMIT, dirtiness unknown
    import subprocess

    from poskit.report import record

    real_run = subprocess.run

    def no_git(cmd, *args, **kwargs):
        if cmd[0] == "git":
            return subprocess.CompletedProcess(cmd, 128, "", "fatal: not a git repository")
        return real_run(cmd, *args, **kwargs)

    monkeypatch.delenv(record.CODE_COMMIT_ENV, raising=False)
    in_git = record.code_info()
    assert in_git["git_commit"] and in_git["dirty"] is not None  # this checkout, read by git
    monkeypatch.setenv(record.CODE_COMMIT_ENV, "abc1234def")
    info = record.code_info()  # the commit given wins, also over a .git the copy may carry
    assert info["git_commit"] == "abc1234def" and info["dirty"] is None
    assert record.code_label(info).endswith("(abc1234)")
    monkeypatch.setattr(record.subprocess, "run", no_git)
    assert record.code_info()["git_commit"] == "abc1234def"
    monkeypatch.delenv(record.CODE_COMMIT_ENV)
    assert record.code_info()["git_commit"] is None


def test_a_gpu_document_names_the_gpu_and_a_cpu_document_does_not(document):
    from poskit.report.benchmark import provenance

    doc = read_document(document)
    doc["machine"]["gpu"] = "NVIDIA H100 80GB HBM3 (CUDA 13.0)"
    assert "NVIDIA H100" not in provenance(doc, "x")  # measured on the CPU of a machine that has a GPU
    doc["settings"]["device"] = "cuda"
    assert "· NVIDIA H100 80GB HBM3 (CUDA 13.0) and " in provenance(doc, "x")


def test_cuda_without_a_gpu_and_bad_counts_are_refused_before_measuring(capsys, monkeypatch):
    import torch

    from poskit.attention import engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(engine, "triton_available", lambda: False)
    for argv, message in (([*QUICK, "--device", "cuda"], "--device cuda: torch sees no CUDA device"),
                          ([*QUICK, "--with-triton"], "--with-triton: backend='triton' needs the triton package"),
                          ([*QUICK, "--calls", "0"], "--calls must be a positive integer, got 0"),
                          ([*QUICK, "--warmup", "-1"], "--warmup must be 0 or more, got -1"),
                          ([*QUICK, "--decode-room", "0"], "--decode-room must be a positive integer, got 0"),
                          ([*QUICK, "--decode-kv-heads", "3"],
                           "--decode-kv-heads must be a positive divisor of --H (8), got 3")):
        with pytest.raises(SystemExit):
            _attention_benchmark().main(argv)
        err = capsys.readouterr()
        assert message in err.err and "attention benchmark on" not in err.out


def test_decode_rows_name_each_steps_path_and_the_caches_room(tmp_path):
    # a decode step's path is planned inside cached_attention; the rows say which it was, and how much room the
    # cache kept (generation's cache keeps room, so its keys are a view with gaps between heads)
    path = tmp_path / "docs" / "results" / "bench-d" / "benchmark.json"
    _attention_benchmark().main(["--quick", "--skip-grid", "--threads", "1", "--decode-room", "40", "--json",
                                 str(path)])
    doc = read_document(path)
    rows = doc["parts"]["decode"]["rows"]
    named = dict(re.fullmatch(r"(.+) \[(.+)\]", r["encoding"]).groups() for r in rows)
    assert list(named) == ["rope", "pope", "pope, Cartesian cache", "alibi", "cope"]
    assert named["pope"] == "magnitude-decode" and named["pope, Cartesian cache"] == "blocked"
    assert named["rope"] in ("sdpa", "cpu-flash") and named["alibi"] != "reference"
    assert all(r["room"] == 40 and r["cache"] == 256 for r in rows) and doc["settings"]["decode_room"] == 40
    assert "room" in doc["parts"]["decode"]["columns"]


def test_decode_rows_with_grouped_kv_heads_and_the_kernel_off(tmp_path):
    # --decode-kv-heads caches fewer kv heads than query heads; --without-kernel adds RoPE's, PoPE's, ALiBi's and
    # CoPE's steps with the compiled kernel off, on the paths a machine without a compiler takes (RoPE's: SDPA,
    # the speed goals' baseline)
    path = tmp_path / "docs" / "results" / "bench-g" / "benchmark.json"
    _attention_benchmark().main(["--quick", "--skip-grid", "--threads", "1", "--decode-kv-heads", "2",
                                 "--without-kernel", "--json", str(path)])
    doc = read_document(path)
    rows = doc["parts"]["decode"]["rows"]
    named = dict(re.fullmatch(r"(.+) \[(.+)\]", r["encoding"]).groups() for r in rows)
    assert named["rope, POSKIT_CPU_KERNEL=0"] == "sdpa"
    assert named["alibi, POSKIT_CPU_KERNEL=0"] == "blocked"
    assert named["cope, POSKIT_CPU_KERNEL=0"] == "blocked-contextual"
    assert all(r["kv_heads"] == 2 for r in rows) and doc["settings"]["decode_kv_heads"] == 2


def test_with_triton_adds_the_fused_kernel_beside_each_encoding_that_has_one(tmp_path):
    # the grid's rows take the default path (on CUDA, PoPE's full sequences go to SDPA); --with-triton times the
    # fused kernel too, for the encodings that declare one, so a GPU run measures the kernels whatever auto picks
    pytest.importorskip("triton")
    path = tmp_path / "docs" / "results" / "bench-t" / "benchmark.json"
    # (not --quick, whose T=256 under the Triton interpreter took a minute)
    _attention_benchmark().main(["--B", "1", "--T", "64", "--D", "32", "--H", "2", "--dtypes", "fp32", "--repeats",
                                 "1", "--warmup", "0", "--encodings", "pope,alibi", "--skip-peers", "--skip-decode",
                                 "--threads", "1", "--with-triton", "--json", str(path)])
    labels = [r["path"] for r in read_document(path)["parts"]["attention"]["rows"]]
    assert "pope, backend=triton [triton]" in labels
    assert not any(label.startswith("alibi, backend=triton") for label in labels)
    assert all(label != "pope [triton]" for label in labels)  # CPU tensors: auto never takes the interpreter


def test_call_overhead_writes_each_encodings_calls_beside_bare_sdpa(tmp_path):
    module = load_benchmark("call_overhead")
    path = tmp_path / "docs" / "results" / "bench-o" / "benchmark.json"
    module.main(["--quick", "--encodings", "rope,alibi,sinusoidal", "--json", str(path)])
    rows = read_document(path)["parts"]["call_overhead"]["rows"]
    assert [(r["call"], r["encoding"]) for r in rows] == [
        ("call", "SDPA alone"), ("call", "rope"), ("call", "alibi"),
        ("decode", "SDPA alone"), ("decode", "rope"), ("decode", "alibi")]  # absolute encodings: not in attention
    for r in rows:
        bare = next(b for b in rows if b["call"] == r["call"] and b["encoding"] == "SDPA alone")
        assert float(r["over_sdpa_us"]) == pytest.approx(float(r["us_per_call"]) - float(bare["us_per_call"]),
                                                         abs=0.11)
    with pytest.raises(SystemExit):
        module.main(["--quick", "--calls", "0"])


def test_calls_per_sample_divide_the_sample(monkeypatch):
    # each timed sample makes `calls` calls; the row reports one call's time
    module = _attention_benchmark()
    monkeypatch.setattr(module, "interleaved_medians", lambda runs, rounds, warmup: {k: 30.0 for k in runs})
    import argparse

    args = argparse.Namespace(H=2, D=8, shapes=[(1, 16)], dtypes=["fp32"], modes=["fwd"], encodings="rope",
                              repeats=1, warmup=0, calls=3, device="cpu", max_gb=1.0, without_kernel=False,
                              with_triton=False, skip_peers=True)
    rows, _ = module.bench_grid(args)
    assert [r["ms"] for r in rows] == ["10.0", "10.0"]


def test_train_step_writes_a_benchmark_document(tmp_path):
    module = load_benchmark("train_step")
    path = tmp_path / "docs" / "results" / "bench-t" / "benchmark.json"
    module.main(["--quick", "--encodings", "rope,alibi", "--json", str(path)])
    doc = read_document(path)
    rows = doc["parts"]["train_step"]["rows"]
    assert [r["encoding"] for r in rows] == ["rope", "alibi"] and rows[0]["tokens/s vs rope"] == "1.00"
    assert doc["settings"]["device"] == "cpu" and doc["command"].startswith("python benchmarks/train_step.py --quick")


def test_a_path_that_fails_is_reported_and_the_others_are_still_measured(monkeypatch):
    # a kernel that does not compile on the machine (seen: a Triton pipeliner error on an H100) must not end the run
    import argparse

    module = _attention_benchmark()
    real = module.poskit.attention

    def attention(q, k, v, enc, **kwargs):
        if enc.name == "alibi":
            raise RuntimeError("compiler says no\nPassManager::run failed")
        return real(q, k, v, enc, **kwargs)

    monkeypatch.setattr(module.poskit, "attention", attention)
    args = argparse.Namespace(H=2, D=8, shapes=[(1, 16)], dtypes=["fp32"], modes=["fwd"], encodings="alibi,rope",
                              repeats=1, warmup=0, calls=1, device="cpu", max_gb=1.0, without_kernel=False,
                              with_triton=False, skip_peers=True)
    rows, _ = module.bench_grid(args)
    by_path = {r["path"].split(" [")[0]: r for r in rows}
    assert by_path["alibi"]["ms"] == "failed: RuntimeError: PassManager::run failed" and "ratio" not in by_path["alibi"]
    assert float(by_path["rope"]["ms"]) > 0 and by_path["rope"]["ratio"]


def test_the_gpu_machine_script_runs_only_the_parts_asked_for(tmp_path):
    # one command per lent GPU machine: a broken script would cost device time, so its frame is checked here
    import subprocess
    import sys

    script = BENCH.parent / "gpu_machine.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {**__import__("os").environ, "OUT": str(tmp_path), "PARTS": "none", "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "all parts ended" in run.stdout and "building the CPU kernel" not in run.stdout
    assert (tmp_path / "logs.tar.gz").exists() and not (tmp_path / "env.txt").exists()
    with tarfile.open(tmp_path / "logs.tar.gz") as logs:
        assert "logs/env.txt" in logs.getnames()  # inside: a lent machine returns eight files at most
    assert not any(p.name == "benchmark.json" for p in tmp_path.rglob("*"))
    without_out = {k: v for k, v in env.items() if k != "OUT"}
    refused = subprocess.run(["bash", str(script)], env=without_out, capture_output=True, text=True)
    assert refused.returncode != 0 and "set OUT" in refused.stderr
