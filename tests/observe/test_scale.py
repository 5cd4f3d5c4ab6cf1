"""tfscache.observe.scale alone: the unload rate over a sliding window and the advice, with a fake clock."""

from __future__ import annotations

import pytest

from tfscache.observe.scale import FEWER, HOLD, MORE, NodeLoad, UnloadRate, advise
from tfscache.settings import ScaleSection


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_unloads_per_minute_over_a_sliding_window():
    clock = Clock()
    rate = UnloadRate(window_s=300.0, clock=clock)
    assert rate.per_minute("node0") == 0.0
    for _ in range(50):
        rate.record("node0")
        clock.now += 1.0  # 50 unloads in 50 s
    assert rate.per_minute("node0") == pytest.approx(50 * 60 / 300)  # counted over the whole window: 10/min
    assert rate.per_minute("node1") == 0.0  # per node
    clock.now = 1000.0 + 300.0 + 24.5  # the first 25 left the window
    assert rate.per_minute("node0") == pytest.approx(25 * 60 / 300)
    clock.now += 1000.0
    assert rate.per_minute("node0") == 0.0


def load(name="n", rate=0.0, models=0, size=0, max_models=0, memory=0, healthy=True) -> NodeLoad:
    return NodeLoad(name, rate, models, size, max_models, memory, healthy)


SCALE = ScaleSection(unloads_per_minute_high=10.0, unloads_per_minute_low=1.0, headroom=0.2)


@pytest.mark.parametrize("nodes, value, why", [
    ([], HOLD, "no local node"),
    ([load(rate=10.0)], MORE, "10.0 unloads per minute per node >= 10"),
    ([load(rate=16.0), load(rate=4.0)], MORE, "10.0 unloads"),  # the mean over the nodes
    ([load(rate=12.0), load(rate=4.0)], HOLD, "8.0 unloads per minute per node > 1"),
    ([load(rate=0.0, models=1, max_models=10)], HOLD, "one node"),
    # 2 nodes x 10 models: one node fewer holds 10 x 0.8 = 8
    ([load(models=4, max_models=10), load(models=4, max_models=10)], FEWER, "8 models <= 8"),
    ([load(models=5, max_models=10), load(models=4, max_models=10)], HOLD, "9 models resident need more than 8"),
    ([load(models=4, max_models=10), load(models=4, max_models=10, healthy=False)], HOLD, "a node is down"),
    ([load(models=1), load(models=1)], HOLD, "no caps"),
    # memory binds: 3 nodes of 100 bytes, two hold 160 with headroom
    ([load(size=60, memory=100), load(size=60, memory=100), load(size=40, memory=100)], FEWER, "160 bytes <= 160"),
    ([load(size=60, memory=100), load(size=60, memory=100), load(size=41, memory=100)], HOLD, "161 bytes"),
    # both caps: each must fit
    ([load(models=2, size=90, max_models=10, memory=100), load(models=2, size=90, max_models=10, memory=100)],
     HOLD, "180 bytes"),
    # unequal caps: the largest node is the one assumed gone
    ([load(models=3, max_models=4), load(models=1, max_models=8)], HOLD, "4 models resident need more than 3"),
])
def test_advice(nodes, value, why):
    advice = advise(nodes, SCALE)
    assert advice.value == value
    assert why in advice.reason


def test_a_rate_between_the_thresholds_never_advises_fewer():
    nodes = [load(rate=1.5, models=0, max_models=10), load(rate=1.5, models=0, max_models=10)]
    assert advise(nodes, SCALE).value == HOLD
    assert advise(nodes, ScaleSection(unloads_per_minute_low=2.0)).value == FEWER
