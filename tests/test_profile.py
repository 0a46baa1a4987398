"""Profiler: cards are measured on this device and their bytes match what the options hold."""
import json

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from stateremat.cli import app  # noqa: E402
from stateremat.contract import load_card  # noqa: E402
from stateremat.paper.profile import profile_workload  # noqa: E402
from stateremat.paper.workloads import WorkloadConfig  # noqa: E402

CFG = WorkloadConfig(state_bytes=32 * 1024, width=16, batch=64, live_versions=3, segments=4,
                     write_fraction=0.01)


@pytest.fixture(scope="module")
def card():
    return profile_workload(CFG, repeats=1)


def test_card_has_every_option_and_metadata(card):
    assert card.segment_names == ["seg0", "seg1", "seg2", "seg3"]
    assert "region" not in card.segments[0].options  # seg0 has no declared state
    for s in card.segments[1:]:
        assert set(s.options) == {"eager", "whole", "region", "recompute_only"}
    assert card.meta["memory_method"] == "cpu_live_storage_tracker"
    assert card.meta["workload"] == CFG.to_dict() and len(card.meta["source_hash"]) == 64
    assert all(c.time_s > 0 for s in card.segments for c in s.options.values())


def test_persistent_bytes_are_parameters_gradients_state_and_input(card):
    w, h = CFG.width, CFG.hidden
    params = 4 * (w * h + h + h * w) * CFG.segments
    assert card.persistent_bytes == 2 * params + CFG.state_rows * w * 4 + CFG.batch * w * 4


def test_retained_bytes_match_what_each_option_holds(card):
    act_y = CFG.batch * CFG.width * 4
    act_h = CFG.batch * CFG.hidden * 4
    for s in card.segments[1:]:
        o = s.options
        # recompute_only keeps only the output handed to the next segment
        assert o["recompute_only"].retained_bytes == act_y
        # whole adds exactly one snapshot of the declared buffer
        assert o["whole"].retained_bytes - o["recompute_only"].retained_bytes == CFG.state_bytes
        # region adds its journal: exactly the written rows (whole rows), fewer bytes than the snapshot
        extra = o["region"].retained_bytes - o["recompute_only"].retained_bytes
        assert extra > 0 and extra % (CFG.width * 4) == 0 and extra < CFG.state_bytes
        assert extra == s.meta["region_preserved_bytes"]
        # eager keeps tanh's output (batch, hidden) and the output (batch, width), plus scores
        assert act_h + act_y <= o["eager"].retained_bytes < act_h + act_y + 4096


def test_region_journal_of_early_segments_covers_later_writes(card):
    j = [s.meta["region_preserved_bytes"] for s in card.segments[1:]]
    assert j == sorted(j, reverse=True) and j[0] > j[-1]  # R6: union with later writes


def test_profile_cli_writes_a_card(tmp_path):
    out = tmp_path / "card.json"
    res = CliRunner().invoke(app, ["profile", "feature_queue", "--preset", "cpu", "--activations",
                                   "small", "--live", "2", "--repeats", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    card = load_card(out)
    assert card.meta["workload"]["width"] == 8 and len(card.segments) == 2
    assert json.loads(out.read_text())["schema_version"] == 1


def test_profile_cli_rejects_bad_input(tmp_path):
    res = CliRunner().invoke(app, ["profile", "kv_cache", "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 2 and "workload" in res.output
