import json
import signal

import pandas as pd
import pytest

import stateremat
from stateremat.contract import (
    RULES, Outcome, ReplayError, ProfileCardError, UndeclaredStateError,
    ReplayDivergenceError, UnsupportedError, internal_assert, parse_size,
)
from stateremat._shared.io import atomic_write_json, source_hash
from stateremat.paper.records import RecordsError, RecordStore, read_records


def test_rules_are_numbered_and_cited():
    assert list(RULES) == [f"R{i}" for i in range(1, len(RULES) + 1)]
    assert "eq. 2" in RULES["R2"]


def test_error_hierarchy():
    for cls in (UndeclaredStateError, ReplayDivergenceError, UnsupportedError, ProfileCardError):
        assert issubclass(cls, ReplayError) and issubclass(cls, RuntimeError)
    assert issubclass(ProfileCardError, ValueError)
    with pytest.raises(AssertionError, match="this is a bug|This is a bug"):
        internal_assert(False, "x")


def test_records_error_is_the_paper_wings_value_error(monkeypatch, capsys):
    import stateremat.cli
    import stateremat.contract

    assert "RecordsError" not in stateremat.contract.__all__ and not hasattr(stateremat.contract, "RecordsError")
    assert RecordsError.__module__ == "stateremat.paper.records._errors"
    assert issubclass(RecordsError, ValueError) and not issubclass(RecordsError, ReplayError)

    def refuse(**_):
        raise RecordsError("stateremat records: x. Tip: y.")

    monkeypatch.setattr(stateremat.cli, "app", refuse)  # bad input: one error line, exit 2
    stops = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(SystemExit) as exit_:
            stateremat.cli.main()
    finally:  # main installs the command's stop handlers
        for s, h in stops.items():
            signal.signal(s, h)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: RecordsError: stateremat records: x. Tip: y.\n"


def test_outcome_values():
    assert [str(o) for o in Outcome] == ["M", "R", "D", "unsupported"]
    assert f"{Outcome.M}" == "M"


@pytest.mark.parametrize("text,expected", [
    ("4096", 4096), (4096, 4096), ("32GiB", 32 * 2**30), ("1.5 MiB", 1572864),
    ("64mib", 64 * 2**20), ("2KiB", 2048), ("1GB", 10**9),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["-1", "12XB", "GiB", "", "1 2"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_record_store_appends_reads_and_resumes(tmp_path):
    store = RecordStore(tmp_path, "t", key=["seed", "check"], meta={"programs": 3})
    assert store.done_keys() == set()
    store.append([{"seed": 0, "check": "a", "outcome": "M", "err": 0.0},
                  {"seed": 1, "check": "a", "outcome": "D", "err": 1.5}])
    store.append([{"seed": 2, "check": "a", "outcome": "R", "err": float("nan")}])
    again = RecordStore(tmp_path, "t", key=["seed", "check"], meta={"programs": 3})
    assert again.done_keys() == {(0, "a"), (1, "a"), (2, "a")}
    df = read_records(tmp_path, "t")
    assert sorted(df["outcome"]) == ["D", "M", "R"]
    side = json.loads((tmp_path / "t.json").read_text())
    assert side["config"] == {"programs": 3} and "git_revision" in side["provenance"]
    assert len(side["resumed_utc"]) == 1
    with pytest.raises(RecordsError, match="new --out"):
        RecordStore(tmp_path, "t", key=["seed"], meta={"programs": 4})
    with pytest.raises(RecordsError, match="key columns"):
        store.append([{"check": "b"}])


def test_atomic_json_writes_null_for_nan(tmp_path):
    p = atomic_write_json(tmp_path / "x.json", {"a": float("nan"), "b": [1.0, float("inf")]})
    assert json.loads(p.read_text()) == {"a": None, "b": [1.0, None]}
    assert not list(tmp_path.glob(".*tmp"))


def test_source_hash_is_stable():
    assert source_hash({"b": 1, "a": 2}) == source_hash({"a": 2, "b": 1})
    assert source_hash("x") != source_hash("y")


def test_version_and_public_names():
    assert stateremat.__version__
    assert {"ReplayError", "Outcome", "RULES"} <= set(dir(stateremat))


def test_cli_help_lists_commands():
    from typer.testing import CliRunner
    from stateremat.cli import app

    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0
    for cmd in ("verify", "cohort", "bench", "app"):
        assert cmd in res.output


def test_record_store_refuses_a_second_writer_process(tmp_path):
    import subprocess
    import sys

    RecordStore(tmp_path, "t", key=["k"], meta={})
    code = ("import sys; from stateremat.paper.records import RecordsError, RecordStore\n"
            "try:\n RecordStore(sys.argv[1], 't', key=['k'], meta={})\n"
            "except RecordsError as e:\n print('refused:', e); sys.exit(3)\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 3 and "another process is writing" in res.stdout


def test_record_store_out_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep me")
    with pytest.raises(RecordsError, match="is a file"):
        RecordStore(f, "t", key=["k"])
    assert f.read_text() == "keep me"


def test_atomic_write_has_umask_permissions(tmp_path):
    import os
    import stat

    p = atomic_write_json(tmp_path / "p.json", {})
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask


def test_parse_size_is_exact_and_bounded():
    assert parse_size(2**52 + 1) == 2**52 + 1
    assert parse_size(str(2**52 + 1)) == 2**52 + 1
    assert parse_size("0.5KiB") == 512
    for bad in ("1e400", float("inf"), "1e30", 2**60, True, "-1GiB"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)


def test_main_job_is_bench_fair():
    from typer.testing import CliRunner
    from stateremat.cli import app

    res = CliRunner().invoke(app, ["main", "--help"])
    assert res.exit_code == 0 and "bench fair" in res.output
