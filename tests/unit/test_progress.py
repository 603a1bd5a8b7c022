"""The progress bar of long runs: every item passes, the status follows each finished item."""

from types import SimpleNamespace

from dspark_lab.progress import ratios_so_far, track


def test_track_yields_every_item_and_shows_the_status_after_each(capsys):
    done, shown = [], []

    def status():
        shown.append(len(done))
        return f"{len(done)} done"

    for batch in track([[1, 2], [3], [4, 5, 6]], "soak", "req", total=6, size=len, status=status):
        done.extend(batch)
    assert done == [1, 2, 3, 4, 5, 6]
    assert shown == [2, 3, 6]  # read once each item's work is done
    err = capsys.readouterr().err
    assert "soak" in err and "6/6" in err and "6 done" in err


def test_ratios_so_far_reads_the_results_running_ratios():
    assert ratios_so_far(SimpleNamespace(rounds=[])) == "warm-up"
    result = SimpleNamespace(rounds=[{}], summary=lambda: {"ratios": {
        "adaptive / phase 1/2": {"median": 1.0912}, "adaptive / fixed k=0": {"median": 0.9871}, "x / y": {"median": 2}}})
    assert ratios_so_far(result) == "adaptive / phase 1/2 1.091, adaptive / fixed k=0 0.987"
