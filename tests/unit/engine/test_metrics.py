"""Ray's metrics: the trackers' series as Prometheus gauges, what their names held as labels.

The endpoint itself (Ray's agent exporting them, scraped with prometheus_client's parser) is checked
end to end in tests/e2e/test_chaos.py."""

from dlc.engine.metrics import series


def test_points_become_prometheus_series_with_what_their_names_held_as_labels():
    assert series("train/loss/learner_3") == ("dlc_train_loss", {"learner": "3"})
    assert series("learner/tokens_per_s/learner_0") == ("dlc_learner_tokens_per_s", {"learner": "0"})
    assert series("goodput/badput_s/dead") == ("dlc_goodput_badput_s", {"bucket": "dead"})
    # An event's kind is a label, even one that begins like a learner's suffix.
    assert series("events/learner_died") == ("dlc_events", {"kind": "learner_died"})
    assert series("goodput/goodput") == ("dlc_goodput_goodput", {})
    assert series("eval/bits_per_byte") == ("dlc_eval_bits_per_byte", {})
