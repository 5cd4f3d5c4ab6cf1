"""The merge of several nodes' model statistics (tfscache.frontend.protocols.oip.stats.merge), pure."""

from __future__ import annotations

from tfscache.frontend.protocols.oip.stats import merge


def node(count: int, ns: int, last: int, batch: int = 1, memory: str = "CPU") -> dict:
    duration = {"count": count, "ns": ns}
    return {"model_stats": [{
        "name": "m", "version": "1", "last_inference": last, "inference_count": count, "execution_count": count,
        "inference_stats": {"success": duration, "fail": {"count": 0, "ns": 0}},
        "response_stats": {"0": {"success": duration}},
        "batch_stats": [{"batch_size": batch, "compute_infer": duration}],
        "memory_usage": [{"type": memory, "id": 0, "byte_size": 10}]}]}


def test_counts_and_durations_are_summed_and_last_inference_is_the_latest():
    merged = merge([node(2, 100, 5000), node(3, 50, 7000, batch=2, memory="GPU")])["model_stats"]
    assert len(merged) == 1
    stats = merged[0]
    assert (stats["inference_count"], stats["execution_count"], stats["last_inference"]) == (5, 5, 7000)
    assert stats["inference_stats"] == {"success": {"count": 5, "ns": 150}, "fail": {"count": 0, "ns": 0}}
    assert stats["response_stats"] == {"0": {"success": {"count": 5, "ns": 150}}}
    assert stats["batch_stats"] == [{"batch_size": 1, "compute_infer": {"count": 2, "ns": 100}},
                                    {"batch_size": 2, "compute_infer": {"count": 3, "ns": 50}}]
    assert [m["type"] for m in stats["memory_usage"]] == ["CPU", "GPU"]


def test_same_batch_size_is_summed_and_protobuf_strings_count_as_numbers():
    a, b = node(1, 10, 1), node(1, 20, 2)
    b["model_stats"][0]["inference_count"] = "1"  # MessageToDict writes uint64 as strings
    merged = merge([a, b])["model_stats"][0]
    assert merged["inference_count"] == 2
    assert merged["batch_stats"] == [{"batch_size": 1, "compute_infer": {"count": 2, "ns": 30}}]


def test_other_versions_stay_apart():
    a, b = node(1, 10, 1), node(1, 20, 2)
    b["model_stats"][0]["version"] = "2"
    assert [s["version"] for s in merge([a, b])["model_stats"]] == ["1", "2"]
