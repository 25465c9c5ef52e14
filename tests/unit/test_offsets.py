from aiokafka import TopicPartition

from agentstream.streams.runtime.offsets import OffsetTracker

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def test_commits_only_contiguous_done_offsets():
    tracker = OffsetTracker()
    for offset in (10, 11, 12, 13):
        tracker.started(TP, offset)
    tracker.done(TP, 12)
    tracker.done(TP, 13)
    assert tracker.committable() == {}  # 10 and 11 are still running
    tracker.done(TP, 10)
    assert tracker.committable() == {TP: 11}
    assert tracker.committable() == {}  # nothing new
    tracker.done(TP, 11)
    assert tracker.committable() == {TP: 14}
    assert tracker.in_flight == 0


def test_partitions_are_independent_and_forget_drops_revoked():
    tracker = OffsetTracker()
    tracker.started(TP, 0)
    tracker.started(TP1, 5)
    tracker.done(TP1, 5)
    assert tracker.committable() == {TP1: 6}
    assert tracker.in_flight == 1
    tracker.forget({TP})
    assert tracker.in_flight == 0
    tracker.done(TP, 0)  # finished after revocation: ignored
    assert tracker.committable() == {}


def test_a_failed_commit_is_handed_out_again():
    """A commit that failed (coordinator moved, request timed out) is retried by the next tick, also when
    nothing new finished meanwhile: otherwise finished records would be redone after a restart."""
    tracker = OffsetTracker()
    for offset in (0, 1, 2):
        tracker.started(TP, offset)
    tracker.done(TP, 0)
    tracker.done(TP, 1)
    failed = tracker.committable()
    assert failed == {TP: 2}
    tracker.uncommitted(failed)
    assert tracker.committable() == {TP: 2}  # the same position again
    assert tracker.committable() == {}  # and only once it succeeded
    tracker.done(TP, 2)
    stale = {TP: 2}
    assert tracker.committable() == {TP: 3}
    tracker.uncommitted(stale)  # an older failure does not undo a newer position
    assert tracker.committable() == {}
