"""docs/migration.md's worked example stays true: its TOML is valid settings, its labels.json is read
as the repository reads labels, and its symlinked model is listed like any other."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tfscache import settings
from tfscache.repository.local import ModelRepository

DOC = (Path(__file__).resolve().parent.parent / "docs" / "migration.md").read_text()


def test_the_worked_examples_toml_is_valid_settings(tmp_path):
    [toml] = re.findall(r"```toml\n(.*?)```", DOC, re.S)
    config = tmp_path / "tfscache.toml"
    config.write_text("\n".join(line.strip() for line in toml.splitlines()))
    s = settings.load(config, env={"TFSCACHE_MODEL_REPOSITORY": str(tmp_path)})
    assert s.node.node_command == "tensorflow_model_server" and s.node.local_nodes == 2
    assert s.node.extra_args == ["--enable_batching", "--batching_parameters_file=/etc/tfs/batching.config"]
    assert (s.cache.max_models_per_node, s.server.metrics_port) == (4, 8503)


def test_the_worked_examples_labels_and_symlink(tmp_path):
    text = re.search(r"`/models/ranker/labels.json`:\n\n\s+(\{.*?\})\n", DOC).group(1)
    (tmp_path / "data" / "bert-base" / "3").mkdir(parents=True)
    (tmp_path / "models" / "ranker" / "7").mkdir(parents=True)
    (tmp_path / "models" / "ranker" / "8").mkdir()
    (tmp_path / "models" / "ranker" / "labels.json").write_text(text)
    (tmp_path / "models" / "bert").symlink_to(tmp_path / "data" / "bert-base")  # ln -s, as step 1 does
    repository = ModelRepository(tmp_path / "models")
    assert json.loads(text) == {"stable": 7, "canary": 8}
    assert (repository.label_version("ranker", "stable"), repository.label_version("ranker", "canary")) == (7, 8)
    assert repository.latest_version("ranker") == 8  # a version-less request: the highest on disk
    assert repository.latest_version("bert") == 3
