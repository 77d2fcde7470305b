"""bench/record_rounds.py turns an acceptance run into the rounds the gate's
replay tests read: the plain step time from the run's tok/s, and each
forced DFlash round's whole time where the run recorded it, with its
draft's time (what a shadow probe costs)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import record_rounds  # noqa: E402  (needs the path above)


def cost(mode, committed, draft, verify, rollback, whole=None):
    out = {"mode": mode, "committed": committed, "draft_ms": draft, "verify_ms": verify,
           "rollback_ms": rollback}
    if whole is not None:
        out["round_ms"] = whole
    return out


def test_rounds_use_the_whole_round_time_where_recorded():
    run = {"max_tokens": 96, "regimes": {
        "code": {"ours_ar_tps": 500.0, "prompts": [
            {"round_costs": [cost("ar", 1, 0.0, 2.0, 0.0, 2.1),
                             cost("dflash", 3, 1.0, 2.0, 0.1, 3.6),
                             cost("dflash", 1, 1.0, 2.0, 0.1)]},
        ]},
    }}
    recorded = record_rounds.record(run, "a test")
    assert recorded["request_tokens"] == 96
    code = recorded["regimes"]["code"]
    assert code["ar_ms"] == 2.0
    # Plain rounds are left out; the second DFlash round, from a run
    # before round_ms was kept, is its parts' sum; each keeps its draft.
    assert code["prompts"] == [[[3, 3.6, 1.0], [1, 3.1, 1.0]]]


def test_written_file_reads_back_as_recorded(tmp_path):
    run = {"max_tokens": 8, "regimes": {"prose": {"ours_ar_tps": 250.0, "prompts": [
        {"round_costs": [cost("dflash", 2, 1.5, 2.5, 0.0, 4.25)]}]}}}
    source = tmp_path / "run.json"
    source.write_text(json.dumps(run))
    out = tmp_path / "rounds.json"
    sys.argv = ["record_rounds.py", str(source), str(out), "--source", "a test"]
    record_rounds.main()
    assert json.loads(out.read_text()) == record_rounds.record(run, "a test")
