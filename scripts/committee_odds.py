"""The chance that a committee of W witnesses, drawn from a ledger where attackers hold a share p of the keys,
holds an attacker majority: per round and per 10,000 rounds (docs/design/scale.md). Binomial: a draw with
replacement, which overstates the chance of a draw without replacement from a finite ledger.

    python scripts/committee_odds.py --share 0.2 --sizes 16,32,48,64,96,128,160
"""

from __future__ import annotations

import argparse
from math import expm1, log1p

from gradnode.protocol.committee import at_least


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--share", type=float, default=0.2, help="the attackers' share of the ledger")
    ap.add_argument("--sizes", default="16,32,48,64,96,128,160", help="committee sizes W")
    ap.add_argument("--rounds", type=int, default=10_000)
    args = ap.parse_args()
    print(f"attackers' share {args.share}; W: majority per round, per {args.rounds} rounds; "
          "half or more (they can block a strict majority) per round, per run")
    for w in (int(x) for x in args.sizes.split(",")):
        majority, half = at_least(w, w // 2 + 1, args.share), at_least(w, (w + 1) // 2, args.share)
        run = lambda q: -expm1(args.rounds * log1p(-q))  # noqa: E731  1 - (1 - q)^rounds, without rounding to 0
        print(f"W={w:4d}  {majority:.2e}  {run(majority):.2e}  {half:.2e}  {run(half):.2e}")


if __name__ == "__main__":
    main()
