"""Cards review: profile cards that do not fit their cell, missing or edited frozen cards, and
--dask addresses that are not a tcp Dask scheduler — each through the real CLI."""
from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from _cli import run_cli

COHORT = ["cohort", "processes", "--experiment", "fair44", "--preset", "tiny", "--processes", "1",
          "--steps", "1", "--warmups", "0"]
CARD = Path("profile") / "large_sparse.json"

_run = run_cli


def _text(res) -> str:
    return " ".join(res.output.split())


def _parts(out: Path) -> list[Path]:
    return sorted((out / "cohort_timing").glob("part-*.parquet"))


@pytest.fixture(scope="module")
def cohort_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cards") / "run"
    res = _run(*COHORT, "--out", out)
    assert res.exit_code == 0, res.output
    return out


def _cut_card(src: Path, dst_dir: Path, keep: int = 3) -> Path:
    d = json.loads(src.read_text())
    d["segments"] = d["segments"][:keep]
    dst_dir.mkdir(parents=True, exist_ok=True)
    (dst_dir / "large_sparse.json").write_text(json.dumps(d))
    return dst_dir / "large_sparse.json"


# --- A. a card that does not fit its cell ------------------------------------------------

def test_profile_card_with_other_segments_is_refused_before_anything(cohort_run, tmp_path):
    cut = _cut_card(cohort_run / CARD, tmp_path / "cut")
    out = tmp_path / "run"
    res = _run(*COHORT, "--profile", cut.parent, "--out", out)
    assert res.exit_code == 2, res.output
    text = _text(res)
    assert str(cut) in text and "does not fit cell 'large_sparse'" in text, text
    assert "3 segments, the cell's workload has 16" in text and "Tip:" in text, text
    assert not out.exists()


def test_frozen_card_with_other_segments_is_refused(cohort_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(cohort_run, out)
    _cut_card(cohort_run / CARD, out / "profile")
    res = _run(*COHORT, "--out", out)
    assert res.exit_code == 2, res.output
    text = _text(res)
    assert "frozen card profile/large_sparse.json does not fit cell" in text, text
    assert "3 segments, the cell's workload has 16" in text, text
    assert [p.name for p in _parts(out)] == [p.name for p in _parts(cohort_run)]
    assert len(json.loads((out / CARD).read_text())["segments"]) == 3  # left as it was


def test_rows_that_raised_are_failed_in_report_never_infeasible(cohort_run, tmp_path,
                                                                 monkeypatch):
    # the first line of defence switched off: the processes plan on a card that cannot fit
    import stateremat.paper.cohort._process_cohort as pc

    monkeypatch.setattr(pc, "check_card_fits", lambda *a, **k: None)
    cut = _cut_card(cohort_run / CARD, tmp_path / "cut")
    out = tmp_path / "run"
    res = _run(*COHORT, "--profile", cut.parent, "--out", out)
    assert res.exit_code == 1, res.output  # the processes ran, but a method raised: not a success
    text = _text(res)
    assert "unit(s) ran but raised" in text and "build_method: 3 options for 16 segments" in text, text
    assert "new --out" in text, text
    res = _run("report", out)
    assert res.exit_code == 1, res.output
    text = _text(res)
    assert "row(s) raised" in text and "build_method: 3 options for 16 segments" in text, text
    assert not (out / "cohort.md").exists()


# --- B. a missing or edited frozen card ----------------------------------------------------

def test_missing_frozen_card_is_refused_and_the_original_cards_resume(cohort_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(cohort_run, out)
    (out / CARD).unlink()
    before = _parts(out)
    res = _run(*COHORT, "--out", out)
    assert res.exit_code == 2, res.output
    text = _text(res)
    assert "frozen card profile/large_sparse.json is missing" in text, text
    assert "Tip: restore it (or pass --profile with the original cards)" in text, text
    assert not (out / CARD).exists() and _parts(out) == before  # nothing measured or written
    res = _run("report", out)
    assert res.exit_code == 2 and "profile/large_sparse.json" in _text(res), res.output
    res = _run(*COHORT, "--profile", cohort_run / "profile", "--out", out)
    assert res.exit_code == 0, res.output
    assert "1 processes already done, ran 0" in _text(res), res.output
    assert (out / CARD).read_bytes() == (cohort_run / CARD).read_bytes()
    assert _run("report", out).exit_code == 0


def test_other_profile_for_a_missing_frozen_card_is_refused(cohort_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(cohort_run, out)
    (out / CARD).unlink()
    other = tmp_path / "other"
    other.mkdir()
    d = json.loads((cohort_run / CARD).read_text())
    d["persistent_bytes"] += 8
    (other / "large_sparse.json").write_text(json.dumps(d))
    res = _run(*COHORT, "--profile", other, "--out", out)
    assert res.exit_code == 2, res.output
    assert "is not the card the run" in _text(res), res.output
    assert not (out / CARD).exists()


def test_edited_frozen_card_is_refused_and_report_says_so(cohort_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(cohort_run, out)
    d = json.loads((out / CARD).read_text())
    d["persistent_bytes"] += 8
    (out / CARD).write_text(json.dumps(d))
    before = _parts(out)
    res = _run(*COHORT, "--out", out)
    assert res.exit_code == 2, res.output
    text = _text(res)
    assert "frozen card profile/large_sparse.json" in text and "was changed" in text, text
    assert _parts(out) == before
    res = _run("report", out)
    assert res.exit_code == 2, res.output  # a damaged run folder: refused (issue 27)
    text = _text(res)
    assert "frozen card profile/large_sparse.json" in text and "differs" in text, text
    assert not (out / "cohort.md").exists()


# --- C. --dask: only what can be checked, refused in seconds -------------------------------

@pytest.mark.parametrize("scheme", ["tls", "ucx", "ws", "wss"])
def test_dask_schemes_other_than_tcp_are_refused(scheme, tmp_path):
    with socket.socket() as silent:  # a listener that would pass a bare connect
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        address = f"{scheme}://127.0.0.1:{silent.getsockname()[1]}"
        t = time.monotonic()
        res = _run(*COHORT, "--out", tmp_path / "run", "--dask", address)
    assert time.monotonic() - t < 5
    assert res.exit_code == 2, res.output
    text = _text(res)
    assert f"--dask {address!r}: scheme {scheme!r} is not supported" in text, text
    assert "tcp addresses only" in text and "Tip:" in text, text
    assert not (tmp_path / "run").exists()


def _server(payload: bytes):
    """A listener on 127.0.0.1 that sends ``payload`` to each connection, then holds it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    stop = threading.Event()

    def serve():
        conns = []
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            c.sendall(payload)
            conns.append(c)
        for c in conns:
            c.close()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1], stop


@pytest.mark.parametrize("payload", [b"SSH-2.0-OpenSSH_9.0\r\n", b"HTTP/1.1 400 Bad Request\r\n\r\n",
                                     (24).to_bytes(8, "little") + b"\x00" * 24,
                                     (1 << 40).to_bytes(8, "little")],
                         ids=["ssh", "http", "junk-frames", "huge-length"])
def test_tcp_port_sending_other_bytes_is_refused_in_seconds(payload, tmp_path):
    port, stop = _server(payload)
    try:
        address = f"tcp://127.0.0.1:{port}"
        t = time.monotonic()
        res = _run(*COHORT, "--out", tmp_path / "run", "--dask", address)
        assert time.monotonic() - t < 5
    finally:
        stop.set()
    assert res.exit_code == 2, res.output
    text = _text(res)
    assert f"--dask {address!r}: no Dask scheduler answered there" in text, text
    assert "Tip:" in text and not (tmp_path / "run").exists()
