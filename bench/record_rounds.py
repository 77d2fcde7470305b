"""Writes the rounds the gate's replay tests read (crates/flashbar-engine/
src/policy/recorded_rounds_*.json) from a `bench/acceptance.py --json` file:
per regime, plain decoding's step time (from its tok/s in that run) and each
prompt's forced DFlash rounds of the last repeat as [committed, ms, draft
ms]: the round's whole time (`round_ms`, from the end of the previous round,
as the gate times it) where the run has it, else draft + verify + rollback
(runs before 2026-12-04), and the draft's part (what a shadow probe costs;
the time to queue it on a GPU, where it runs behind the host). Files
recorded before 2026-12-05 hold [committed, ms] only.

    python bench/record_rounds.py target/acceptance.json OUT.json --source "what ran, where, when"
"""

import argparse
import json
from pathlib import Path


def round_ms(cost: dict) -> float:
    if "round_ms" in cost:
        return cost["round_ms"]
    return cost["draft_ms"] + cost["verify_ms"] + cost["rollback_ms"]


def record(run: dict, source: str) -> dict:
    regimes = {}
    for name, regime in run["regimes"].items():
        prompts = [[[r["committed"], round(round_ms(r), 3), round(r["draft_ms"], 3)]
                    for r in prompt["round_costs"] if r["mode"] == "dflash"]
                   for prompt in regime["prompts"]]
        regimes[name] = {"ar_ms": round(1000.0 / regime["ours_ar_tps"], 3), "prompts": prompts}
    return {"source": source, "request_tokens": run["max_tokens"], "regimes": regimes}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path, help="bench/acceptance.py --json output")
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", required=True, help="the command, machine and date of the run")
    args = parser.parse_args()
    recorded = record(json.loads(args.run.read_text()), args.source)
    # One prompt's rounds per line: the file stays readable in a diff.
    lines = []
    for name, regime in recorded["regimes"].items():
        prompts = ",\n".join("      " + json.dumps(p) for p in regime["prompts"])
        lines.append(f'    {json.dumps(name)}: {{"ar_ms": {regime["ar_ms"]}, "prompts": [\n{prompts}\n    ]}}')
    text = ('{\n  "source": ' + json.dumps(recorded["source"]) + ',\n  "request_tokens": '
            + str(recorded["request_tokens"]) + ',\n  "regimes": {\n' + ",\n".join(lines) + "\n  }\n}\n")
    assert json.loads(text) == recorded
    args.out.write_text(text)


if __name__ == "__main__":
    main()
