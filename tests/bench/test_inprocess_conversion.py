"""The inprocess bench's conversion: ours against the best a writer does by hand (one view of
the block, the layout known) as well as against np.stack, every repeat kept. Which is faster
is the bench's figure, not this test's: compared here, one preemption of a view's
microseconds on a busy machine failed the suite. That the hand-written view is the block
itself (no copy) the bench checks before it times it (inprocess.py `_by_hand`)."""

from __future__ import annotations

from sonicsite.bench.inprocess import conversion


def test_conversion_is_measured_against_a_hand_written_view_and_keeps_every_repeat():
    times = conversion(2)
    assert set(times) == {
        "ours_1000",
        "ours_100000",
        "ours_1000000",
        "hand_view_100000",
        "hand_view_1000000",
        "stock_100000",
    }
    for name, found in times.items():
        assert len(found["repeats"]) == 2 and found["median"] > 0, name
        assert found["min"] == min(found["repeats"]) and found["max"] == max(found["repeats"])
