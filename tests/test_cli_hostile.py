"""A hostile tester's findings on the command line's run folders and outputs (issue 28): a run
never takes (nor sweeps) a folder holding someone else's files, a lost standard output is an
error, and a full disk is said with its path and what to do."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _cli import run_cli

import stateremat

SRC = Path(stateremat.__file__).resolve().parents[1]  # the stateremat under test


def _stateremat(*argv, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    kw = {"capture_output": True, **kw}
    return subprocess.run([sys.executable, "-m", "stateremat", *map(str, argv)], env=env,
                          text=True, timeout=300, **kw)


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): (p.read_text() if p.is_file() else "")
            for p in sorted(root.rglob("*"))}


def _user_folder(tmp_path: Path) -> tuple[Path, Path]:
    user, outside = tmp_path / "userdir", tmp_path / "outside"
    (user / ".tmp").mkdir(parents=True)
    (user / "docs" / "deep").mkdir(parents=True)
    outside.mkdir()
    (user / ".tmp" / "important.txt").write_text("precious")
    (user / "docs" / ".notes.tmp").write_text("precious")
    (user / "docs" / "deep" / ".draft.0123abcd.tmp").write_text("precious")
    (user / ".vimswap.tmp").write_text("precious")
    (outside / ".keep.0123abcd.tmp").write_text("precious")
    (user / "linked").symlink_to(outside, target_is_directory=True)
    return user, outside


def test_a_folder_that_is_not_a_run_is_refused_and_left_alone(tmp_path):
    user, outside = _user_folder(tmp_path)
    before = _tree(tmp_path)
    res = run_cli("verify", "finite", "--programs", "2", "--out", user)
    assert res.exit_code == 2, res.output
    assert "not a stateremat run" in res.output and "new or empty folder" in res.output
    assert _tree(tmp_path) == before  # nothing written, nothing removed


def test_an_empty_folder_is_taken(tmp_path):
    (tmp_path / "empty").mkdir()
    assert run_cli("verify", "finite", "--programs", "2", "--out", tmp_path / "empty").exit_code == 0


def test_a_run_folder_sweeps_only_its_own_temporaries(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "outside"
    assert _stateremat("verify", "finite", "--programs", "2", "--out", run).returncode == 0
    outside.mkdir()
    (outside / ".keep.0123abcd.tmp").write_text("precious")
    (outside / "inner").mkdir()
    (outside / "inner" / ".keep.0123abcd.tmp").write_text("precious")
    (run / "linked").symlink_to(outside, target_is_directory=True)
    (run / ".vimswap.tmp").write_text("not the writer's name")
    (run / ".tmpfile.tmp").symlink_to(outside / ".keep.0123abcd.tmp")
    stale = [run / ".finite.json.0123abcd.tmp", run / "finite" / ".part-x.parquet.89abcdef.tmp"]
    for p in stale:
        p.write_text("left by a stop")
    (run / ".tmp" / "cohort").mkdir(parents=True)
    res = _stateremat("verify", "finite", "--programs", "2", "--out", run)  # a fresh process
    assert res.returncode == 0, res.stderr
    assert not any(p.exists() for p in stale) and not (run / ".tmp").exists()
    assert (run / ".vimswap.tmp").read_text() == "not the writer's name"
    assert (outside / ".keep.0123abcd.tmp").read_text() == "precious"
    assert (outside / "inner" / ".keep.0123abcd.tmp").read_text() == "precious"
    assert os.path.islink(run / ".tmpfile.tmp")


def _card(tmp_path: Path) -> Path:
    from stateremat.contract import save_card
    from stateremat.planner import activation_pressure_card

    return save_card(activation_pressure_card(), tmp_path / "card.json")


def test_json_to_a_closed_standard_output_is_an_error(tmp_path):
    card = _card(tmp_path)
    res = _stateremat("plan", card, "--budget", "1e10", "--json", "-", capture_output=False,
                      stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1))  # `>&-`
    assert res.returncode == 2, res.stderr
    assert "standard output is closed" in res.stderr and "Tip:" in res.stderr


def _full_disk(monkeypatch, after: int) -> None:
    import errno

    real, count = os.fsync, [0]

    def fsync(fd):
        count[0] += 1
        if count[0] > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("after", [0, 3])
def test_a_full_disk_names_the_path_and_says_to_resume(tmp_path, monkeypatch, capsys, after):
    from stateremat.cli import main

    out = tmp_path / "full" / "run"
    monkeypatch.setattr(sys, "argv", ["stateremat", "verify", "finite", "--programs", "2",
                                      "--out", str(out)])
    _full_disk(monkeypatch, after)
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "No space left on device: " in err and str(out) in err, err
    assert "free space" in err and "rerun the same command" in err


def test_a_full_disk_in_report_names_the_path(tmp_path, monkeypatch, capsys):
    from stateremat.cli import main

    run = tmp_path / "run"
    assert _stateremat("verify", "finite", "--programs", "2", "--out", run).returncode == 0
    monkeypatch.setattr(sys, "argv", ["stateremat", "report", str(run), "--out",
                                      str(tmp_path / "rep")])
    _full_disk(monkeypatch, 0)
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "No space left on device: " in err and str(tmp_path / "rep") in err, err
    assert "free space" in err


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_while_the_interpreter_finalizes_keeps_the_exit_status(tmp_path, signame):
    # The signal lands after the exit handlers, while Python finalizes (its handlers then reset
    # to the default action): a finished command is not killed by it, with no message.
    script = tmp_path / "late.py"
    script.write_text(textwrap.dedent("""
        import os, runpy, signal, sys
        class Late:
            def __del__(self, kill=os.kill, pid=os.getpid(), sig=int(sys.argv[1])):
                kill(pid, sig)  # from the module teardown, after every exit handler
        late = Late()
        sys.argv = ["stateremat", *sys.argv[2:]]
        runpy.run_module("stateremat", run_name="__main__", alter_sys=True)
    """))
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, str(script), str(int(getattr(signal, signame))),
                          "plan", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, (res.returncode, res.stderr)
    assert "Usage" in res.stdout and "Traceback" not in res.stderr
