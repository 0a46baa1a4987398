"""Profile card format: round trip, atomic save, validation errors naming segment and field."""
from __future__ import annotations

import copy
import json
import math

import pytest

from stateremat.contract import (
    OptionCost,
    ProfileCard,
    ProfileCardError,
    SegmentCard,
    load_card,
    save_card,
)


def _opt(r, q, c):
    return {"retained_bytes": r, "temp_bytes": q, "time_s": c}


def _card_dict():
    return {
        "schema_version": 1,
        "persistent_bytes": 1000,
        "segments": [
            {"name": "seg0", "options": {"eager": _opt(100, 5, 0.1), "whole": _opt(10, 50, 0.3),
                                         "region": _opt(12, 20, 0.2)}},
            {"name": "seg1", "options": {"eager": _opt(200, 5, 0.1), "whole": _opt(1, 60, 0.25),
                                         "recompute_only": _opt(0, 40, 0.2)},
             "meta": {"state_bytes": 0}},
        ],
        "meta": {"device": "cpu", "dtype": "float32", "method": "hand-written"},
    }


def test_round_trip_and_canonical_option_order(tmp_path):
    d = _card_dict()
    card = ProfileCard.from_dict(d)
    assert card.to_dict() == d
    assert card.segment_names == ["seg0", "seg1"]
    assert card.segments[0].options["region"] == OptionCost(12, 20, 0.2)
    assert list(card.segments[1].options) == ["eager", "whole", "recompute_only"]
    path = save_card(card, tmp_path / "sub" / "card.json")
    assert load_card(path) == card
    assert json.loads(path.read_text()) == d
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert card.source_hash() == ProfileCard.from_dict(copy.deepcopy(d)).source_hash()


def test_integral_float_sizes_are_accepted():
    d = _card_dict()
    d["persistent_bytes"] = 1e9
    d["segments"][0]["options"]["eager"]["retained_bytes"] = 2.0
    card = ProfileCard.from_dict(d)
    assert card.persistent_bytes == 10**9 and isinstance(card.persistent_bytes, int)
    assert card.segments[0].options["eager"].retained_bytes == 2


def _mutated(fn):
    d = _card_dict()
    fn(d)
    return d


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d["segments"][1]["options"].pop("whole"),
         r"segment 'seg1'\.options: missing option\(s\) \['whole'\]"),
        (lambda d: d["segments"][0]["options"].pop("eager"), r"segment 'seg0'.*missing.*'eager'"),
        (lambda d: d["segments"][0]["options"]["whole"].update(temp_bytes=-1),
         r"segment 'seg0'\.options\.whole\.temp_bytes: .*non-negative integer.*got -1"),
        (lambda d: d["segments"][1]["options"]["eager"].update(retained_bytes=1.5),
         r"segment 'seg1'\.options\.eager\.retained_bytes: .*got 1\.5"),
        (lambda d: d["segments"][0]["options"]["region"].update(time_s=float("nan")),
         r"segment 'seg0'\.options\.region\.time_s: .*finite.*got nan"),
        (lambda d: d["segments"][0]["options"]["region"].update(time_s=float("inf")),
         r"segment 'seg0'\.options\.region\.time_s: .*got inf"),
        (lambda d: d["segments"][0]["options"]["region"].update(time_s=None),
         r"segment 'seg0'\.options\.region\.time_s: .*got null"),
        (lambda d: d["segments"][0]["options"]["region"].update(time_s=-0.5),
         r"region\.time_s: .*got -0\.5"),
        (lambda d: d["segments"][0]["options"]["region"].update(time_s="fast"),
         r"region\.time_s: .*got str 'fast'"),
        (lambda d: d["segments"][0]["options"]["eager"].update(temp_bytes=True),
         r"eager\.temp_bytes: .*got bool True"),
        (lambda d: d["segments"][0]["options"]["eager"].pop("time_s"),
         r"segment 'seg0'\.options\.eager: missing field\(s\) \['time_s'\]"),
        (lambda d: d["segments"][0]["options"]["eager"].update(retained=3),
         r"segment 'seg0'\.options\.eager: unknown field\(s\) \['retained'\]"),
        (lambda d: d["segments"][0]["options"].update(regoin=_opt(1, 1, 1.0)),
         r"segment 'seg0'\.options: unknown option 'regoin'"),
        (lambda d: d.update(schema_version=2), r"schema_version: expected 1, got 2"),
        (lambda d: d.pop("schema_version"), r"schema_version: missing"),
        (lambda d: d.update(persistent_bytes=-5), r"persistent_bytes: .*got -5"),
        (lambda d: d.pop("segments"), r"segments: missing required field"),
        (lambda d: d.update(segments=[]), r"segments: expected at least one segment"),
        (lambda d: d.update(segments={"seg0": {}}), r"segments: expected a list, got dict"),
        (lambda d: d["segments"][1].update(name="seg0"),
         r"segment 'seg0': duplicate name \(segments\[0\] and segments\[1\]\)"),
        (lambda d: d["segments"][1].update(name=""), r"segments\[1\]\.name: expected a non-empty"),
        (lambda d: d["segments"][1].update(options=[1]), r"segment 'seg1'\.options: expected an object"),
        (lambda d: d["segments"][1].update(extra=1), r"segment 'seg1': unknown field\(s\) \['extra'\]"),
        (lambda d: d.update(meta=[1]), r"meta: expected an object, got list"),
        (lambda d: d.update(budget=3), r"top level: unknown field\(s\) \['budget'\]"),
    ],
)
def test_validation_errors_name_segment_and_field(mutate, match):
    d = _mutated(mutate)
    with pytest.raises(ProfileCardError, match=match) as info:
        ProfileCard.from_dict(d)
    assert "Tip:" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_direct_construction_is_validated_too():
    with pytest.raises(ProfileCardError, match=r"missing option\(s\) \['whole'\]"):
        SegmentCard("s", {"eager": OptionCost(1, 1, 0.1)})
    with pytest.raises(ProfileCardError, match="time_s: .*got nan"):
        OptionCost(1, 1, math.nan)
    seg = SegmentCard("s", {"whole": OptionCost(1, 1, 0.1), "eager": OptionCost(2, 0, 0.05)})
    assert list(seg.options) == ["eager", "whole"]
    with pytest.raises(ProfileCardError, match="duplicate name"):
        ProfileCard(0, [seg, seg])
    with pytest.raises(ProfileCardError, match="schema_version: expected 1, got 3"):
        ProfileCard(0, [seg], schema_version=3)


def test_load_card_errors(tmp_path):
    with pytest.raises(ProfileCardError, match="cannot read"):
        load_card(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileCardError, match="not valid JSON"):
        load_card(bad)
    nan = tmp_path / "nan.json"
    d = _card_dict()
    nan.write_text(json.dumps(d).replace('"time_s": 0.3', '"time_s": NaN'))
    with pytest.raises(ProfileCardError, match=r"segment 'seg0'\.options\.whole\.time_s"):
        load_card(nan)


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["segments"][1]["options"]["whole"].__setitem__("retained_bytes", 2**70),
     r"segment 'seg1'\.options\.whole\.retained_bytes: expected at most 2\^53"),
    (lambda d: d["segments"][0]["options"]["eager"].__setitem__("temp_bytes", 1e30),
     r"segment 'seg0'\.options\.eager\.temp_bytes: expected at most 2\^53"),
    (lambda d: d.__setitem__("persistent_bytes", 2**63), r"persistent_bytes: expected at most 2\^53"),
])
def test_sizes_above_2_53_bytes_are_refused_naming_segment_and_field(mutate, match):
    d = _card_dict()
    mutate(d)
    with pytest.raises(ProfileCardError, match=match):
        ProfileCard.from_dict(d)


def test_cards_whose_total_could_overflow_int64_are_refused_at_the_crossing_segment():
    big = 2**53  # each field is allowed; 512 of them reach 2^62
    segs = [{"name": f"s{i}", "options": {"eager": _opt(big, 0, 0.1), "whole": _opt(1, 0, 0.2)}}
            for i in range(600)]
    d = {"schema_version": 1, "persistent_bytes": 0, "segments": segs}
    with pytest.raises(ProfileCardError, match=r"segment 's511'\.options\.eager\.retained_bytes: "
                                               r"persistent_bytes \+ Σ max retained_bytes"):
        ProfileCard.from_dict(d)
    ok = copy.deepcopy(d)
    ok["segments"] = ok["segments"][:511]  # 511 · 2^53 < 2^62: accepted and plannable exactly
    card = ProfileCard.from_dict(ok)
    from stateremat.planner import plan

    res = plan(card, big)
    assert res.feasible and res.options == ["whole"] * 511 and res.predicted_peak_bytes == 511
    assert plan(card, 0).min_feasible_peak_bytes == 511
    segs = [SegmentCard(f"s{i}", {"eager": OptionCost(big, 0, 0.0), "whole": OptionCost(1, 0, 0.0)})
            for i in range(510)]
    segs.append(SegmentCard("t", {"eager": OptionCost(0, 0, 0.0), "whole": OptionCost(0, big, 0.0)}))
    with pytest.raises(ProfileCardError, match=r"segment 't'\.options\.whole\.temp_bytes"):
        ProfileCard(big, segs)  # 2^53 + 510 · 2^53 + 2^53 = 2^62
    assert ProfileCard(big - 1, segs).persistent_bytes == big - 1  # one byte less fits


@pytest.mark.parametrize("text, says, tip", [
    ("", "is empty", "profile again if that run was cut short"),
    ("  \n", "is empty", "profile again"),
    ('{"persistent_bytes": 1, ', "is not valid JSON", "a card is the JSON `stateremat profile --out`"),
    ('{"persistent_bytes": Infinity, ', "is not valid JSON", "NaN/Infinity are not JSON"),
])
def test_an_unreadable_card_file_gets_a_tip_that_fits_its_cause(tmp_path, text, says, tip):
    path = tmp_path / "card.json"
    path.write_text(text)
    with pytest.raises(ProfileCardError) as e:
        load_card(path)
    assert says in str(e.value) and tip in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_load_card_refuses_what_is_not_a_regular_file_without_blocking(tmp_path, kind):
    """A FIFO blocked load_card (and `stateremat plan`) for a writer forever, /dev/zero read
    forever (/dev/null stands in for it here: a device); each is refused at once, naming the
    file and what it is."""
    import os
    import signal

    path = {"fifo": tmp_path / "card.json", "device": "/dev/null", "folder": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)

    def hung(signum, frame):
        raise TimeoutError("load_card blocked")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        with pytest.raises(ProfileCardError) as err:
            load_card(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    words = {"fifo": "a named pipe (FIFO)", "device": "a character device", "folder": "a folder"}[kind]
    assert f"cannot read {str(path)!r}: it is {words}" in str(err.value)
