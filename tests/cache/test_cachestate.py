"""The state file: atomic round trip, and unreadable files read as empty."""

from __future__ import annotations

import json

from tfscache.cachestate import CacheState, SavedModel, load_state, save_state


def test_round_trip(tmp_path):
    path = tmp_path / "sub" / "node.cache.json"
    state = CacheState("127.0.0.1:1", [SavedModel("m", 3, 1234, True, 1700000000.5),
                                       SavedModel("n", 1, 99, False, 1700000001.0)], {"3:m": 1234})
    save_state(path, state)
    assert load_state(path) == state
    assert not (tmp_path / "sub" / "node.cache.json.tmp").exists()


def test_missing_none_and_corrupt_files_read_as_empty(tmp_path, caplog):
    assert load_state(None) == CacheState()
    assert load_state(tmp_path / "absent.json") == CacheState()
    bad = tmp_path / "bad.json"
    for text in ["{not json", json.dumps({"format": 99, "models": []}),
                 json.dumps({"format": 1, "models": [{"name": "m"}]})]:
        bad.write_text(text)
        assert load_state(bad) == CacheState()
    assert "ignoring unreadable cache state file" in caplog.text


def test_save_to_none_is_a_no_op(tmp_path):
    save_state(None, CacheState("x"))
    assert list(tmp_path.iterdir()) == []
