"""docs/performance.md is generated from the benchmark records (benchmarks/records/, written by benchmarks/_record.py):
the committed page is what the committed records give, every record is complete, and a record written by a
benchmark run reads back and renders."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RECORDS = BENCH / "records"
PAGE = ROOT / "docs" / "performance.md"
# the scripts whose runs are recorded (each has --record / --no-record)
SCRIPTS = (
    "bench_peers.py",
    "bench_batch.py",
    "bench_svm.py",
    "bench_nuclear.py",
    "bench_lp.py",
    "bench_train.py",
    "bench_experiments.py",
    "bench_kv.py",
    "bench_oneprefill.py",
    "bench_gc.py",
    "bench_cuda.py",
    "bench_retrieval_lm.py",
)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def record():
    sys.path.insert(0, str(BENCH))
    try:
        yield _load("_record", BENCH / "_record.py")
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def performance(record):
    return _load("performance_page", ROOT / "docs" / "scripts" / "performance.py")


def test_the_page_is_what_the_records_give(performance):
    expected = performance.render(performance.load_records(RECORDS))
    assert PAGE.read_text(encoding="utf-8") == expected, (
        "docs/performance.md and benchmarks/records/ disagree: run python docs/scripts/performance.py"
    )


def test_every_record_is_complete(record):
    paths = sorted(RECORDS.glob("*.json"))
    assert len(paths) >= 20
    assert {p.suffix for p in RECORDS.iterdir()} == {".json"}, "benchmarks/records/ holds records only"
    benchmarks = set()
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert record.problems(data) == [], (path.name, record.problems(data))
        assert set(record.REQUIRED) <= set(data)
        assert path.name.startswith(data["benchmark"].replace(" ", "-") + "-"), path.name
        assert data["rows"], f"{path.name} has no rows"
        benchmarks.add(data["benchmark"])
        if "source" in data:  # a table copied by hand: says so, and from what
            assert data["source"].startswith("recorded by hand from the"), path.name
    for script in ("bench_svm", "bench_nuclear", "bench_peers", "bench_batch", "bench_train", "bench_kv"):
        assert script in benchmarks


def test_the_page_says_how_to_reproduce_it():
    text = PAGE.read_text(encoding="utf-8")
    assert text.startswith("# Performance\n")
    for needed in ("make bench", "--record", "python docs/scripts/performance.py"):
        assert needed in text
    assert "$" not in text  # (the site typesets $...$ as maths)


def test_a_run_record_round_trips_and_renders(tmp_path, record, performance):
    rec = record.Recorder("bench_demo", True, folder=tmp_path, argv=["/somewhere/benchmarks/bench_demo.py", "--quick"])
    rec.table("First table", ["size", "ours (ms)", "ratio"], [["(6, 8, 10)", 0.367, "2.1×"], ["a | b", 12, "x"]])
    rec.table("Second table", ["n"], [[1]], ["a note"])
    paths = rec.write()
    assert [p.name for p in paths] == [f"bench_demo-{record.stamp(rec.utc)}-{k}.json" for k in (1, 2)]
    first = record.load(paths[0])
    assert first == rec.tables[0]
    assert first["command"] == ["benchmarks/bench_demo.py", "--quick"]
    assert first["rows"][0] == ["(6, 8, 10)", 0.367, "2.1×"]
    assert "CPUs" in first["machine"] and "\n" not in first["machine"]
    page = performance.render(performance.load_records(tmp_path))
    assert page.startswith(performance.HEADER)
    assert "## `benchmarks/bench_demo.py`" in page
    assert "### First table (" in page and "### Second table (" in page
    assert page.index("### First table") < page.index("### Second table")  # a run's tables in printed order
    assert "| (6, 8, 10) | 0.367 | 2.1× |" in page and "| a \\| b | 12 | x |" in page
    assert "- Command: `python benchmarks/bench_demo.py --quick`" in page
    assert "- a note" in page


def test_newest_first_within_a_benchmark(tmp_path, record, performance):
    base = {"benchmark": "bench_demo", "machine": "2 cores", "command": ["benchmarks/bench_demo.py"], "notes": []}
    for utc in ("2026-12-02", "2026-12-05T19:50:00Z", "2026-12-04T08:00:00Z"):
        record.write({**base, "title": f"run {utc}", "utc": utc, "columns": ["x"], "rows": [[1]]}, tmp_path)
    page = performance.render(performance.load_records(tmp_path))
    order = [page.index(f"run {utc}") for utc in ("2026-12-05T19:50:00Z", "2026-12-04T08:00:00Z", "2026-12-02")]
    assert order == sorted(order)
    assert "(2026-12-05 19:50 UTC)" in page and "(2026-12-02)" in page


def test_bad_records_are_refused(tmp_path, record, performance):
    good = {
        "benchmark": "bench_demo",
        "title": "t",
        "utc": "2026-12-05",
        "machine": "m",
        "command": ["benchmarks/bench_demo.py"],
        "columns": ["a", "b"],
        "rows": [[1, "x"]],
        "notes": [],
    }
    assert record.problems(good) == []
    bad = [
        ({k: v for k, v in good.items() if k != "notes"}, "missing field 'notes'"),
        ({**good, "rows": [[1]]}, "row 0 does not have one cell per column"),
        ({**good, "rows": [[1, None]]}, "row 0 has a cell that is not a string or a number"),
        ({**good, "rows": [[1, float("nan")]]}, "row 0 has a number that is not finite"),
        ({**good, "utc": "yesterday"}, "'utc' is not an ISO date or time"),
        ({**good, "notes": ["two\nlines"]}, "'notes' must be one-line strings"),
        ({**good, "extra": 1}, "unknown field 'extra'"),
    ]
    for data, why in bad:
        assert why in record.problems(data)[0], data
        with pytest.raises(ValueError, match=why):
            record.write(data, tmp_path)
    assert not list(tmp_path.iterdir())  # (nothing written)
    (tmp_path / "broken.json").write_text(json.dumps(bad[0][0]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json: missing field 'notes'"):
        performance.load_records(tmp_path)


def test_check_mode(tmp_path, record, performance):
    records, page = tmp_path / "records", tmp_path / "page.md"
    rec = record.Recorder("bench_demo", True, folder=records, argv=["benchmarks/bench_demo.py"])
    rec.table("t", ["x"], [[1]])
    rec.write()
    args = ["--records", str(records), "--page", str(page)]
    assert performance.main([*args, "--check"]) == 1  # no page yet
    assert performance.main(args) == 0
    assert performance.main([*args, "--check"]) == 0
    page.write_text(page.read_text(encoding="utf-8") + "edited\n", encoding="utf-8")
    assert performance.main([*args, "--check"]) == 1


def test_recording_by_default_only_for_full_runs(record):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    record.add_option(ap, "no --quick")
    for argv, expected in (
        ([], True),
        (["--quick"], False),
        (["--repeat", "2"], False),
        (["--quick", "--record"], True),
        (["--no-record"], False),
    ):
        assert record.wanted(ap.parse_args(argv), ap, ("quick", "repeat")) is expected, argv


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_records_its_tables(script):
    """Each benchmark script has the --record option, says in its doc which runs it records, and writes."""
    text = (BENCH / script).read_text(encoding="utf-8")
    assert "add_option(ap, " in text and "wanted(args, ap, " in text
    assert "rec.table(" in text and "rec.write()" in text
    assert "benchmarks/records/" in text.split('"""', 2)[1]  # the module doc, which --help shows or points to
