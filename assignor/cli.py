"""`python -m assignor plan FILE|- [--summary]`: read a scenario, print its assignment.
`python -m assignor what-if --worker URL (--leave NAME | --join N | --restart NAME)`: what a
change would do to a live group (assignor/whatif.py); changes nothing."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from assignor.core.plan import PlanResult, plan_with_stats
from assignor.whatif import Change, WhatIfError, fetch_group, one_line, predict, render


def main(argv: Sequence[str] | None = None, stdin: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assignor", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    plan_cmd = commands.add_parser("plan", help="plan an assignment for a scenario (JSON)")
    plan_cmd.add_argument("scenario", help="scenario file (docs/scenario-format.md), or - for stdin")
    plan_cmd.add_argument("--summary", action="store_true", help="print a human table instead of JSON")
    _add_what_if(commands)
    args = parser.parse_args(argv)
    if args.command == "what-if":
        return what_if(args)
    raw, problem = _read(args.scenario, stdin or sys.stdin)
    result = plan_with_stats(raw)
    if problem:
        result.assignment["warnings"].insert(0, problem)
    with _long_integers_printable(result.assignment["epoch"]):
        print(render_summary(raw, result) if args.summary else json.dumps(result.assignment, indent=2))
    return 0


@contextlib.contextmanager
def _long_integers_printable(epoch: int) -> Iterator[None]:
    """The output's epoch is one more than the input's highest: 4,301 digits when that had
    4,300 (the most the input reads), one more than Python prints by default."""
    if not isinstance(epoch, int) or epoch.bit_length() < 14_000:
        yield
        return
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(limit)


def _add_what_if(commands: Any) -> None:
    cmd = commands.add_parser(
        "what-if", help="predict what a change does to a live group (reads it, changes nothing)"
    )
    cmd.add_argument("--worker", required=True, help="any worker's web server, e.g. http://127.0.0.1:6066")
    change = cmd.add_mutually_exclusive_group(required=True)
    change.add_argument("--leave", metavar="NAME", help="the worker (its name in the view) leaves")
    change.add_argument("--join", metavar="N", type=int, help="N new workers join, with empty disks")
    change.add_argument("--restart", metavar="NAME", help="the worker stops, then comes back with its disk")
    cmd.add_argument("--host", default="", help="host label of the joining workers (default: one each)")
    cmd.add_argument("--rack", default="", help="rack label of the joining workers")
    cmd.add_argument(
        "--protocol",
        choices=("eager", "cooperative"),
        help="plan as if the group ran this rebalance protocol (default: the one the workers report)",
    )
    cmd.add_argument("--json", action="store_true", help="print JSON instead of tables")


def what_if(args: argparse.Namespace) -> int:
    """Read the group from a worker, plan the change, print it; 2 if the group cannot be read."""
    if args.leave:
        change = Change("leave", name=args.leave)
    elif args.restart:
        change = Change("restart", name=args.restart)
    else:
        change = Change("join", count=args.join, host=args.host, rack=args.rack)
    try:
        steps = predict(fetch_group(args.worker), change, args.protocol)
    except WhatIfError as exc:
        print(f"what-if: {one_line(str(exc))}", file=sys.stderr)
        return 2
    print(json.dumps([s.as_dict() for s in steps], indent=2) if args.json else render(steps))
    return 0


def _read(path: str, stdin: TextIO) -> tuple[Any, str | None]:
    """The decoded scenario, or None and why it could not be read (still exit 0: the planner
    answers any input with the best valid assignment and warnings, docs/scenario-format.md)."""
    try:
        text = stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        return None, f"cannot read scenario {path!r}: {exc.strerror}"
    except UnicodeDecodeError as exc:
        return None, f"scenario is not UTF-8 text: {exc.reason} at byte {exc.start}"
    try:
        try:
            return json.loads(text), None
        except json.JSONDecodeError:
            raise
        except ValueError:  # an integer longer than int() reads: again, reading those apart
            return json.loads(text, parse_int=_json_int), None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        return None, f"scenario is not valid JSON: {one_line(str(exc))}"


class TooLongInteger(float):
    """An integer literal longer than Python reads (4,300 digits): the infinity of its sign,
    which the planner refuses like any value that is not a number, with a warning showing it
    by its length (a traceback before)."""

    digits: int

    def __new__(cls, text: str) -> TooLongInteger:
        found = super().__new__(cls, "-inf" if text.startswith("-") else "inf")
        found.digits = len(text.lstrip("-"))
        return found

    def __repr__(self) -> str:
        return f"<an integer of {self.digits:,} digits>"


def _json_int(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:  # more digits than int() reads
        return TooLongInteger(text)


def render_summary(raw: Any, result: PlanResult) -> str:
    """Per member actives/standbys (and warm-ups), then kept, moved warm, moved cold and the
    balance spread; with warm-ups on, the pending moves; in a cooperative round, the revoked
    tasks and whether a follow-up rebalance comes."""
    members = result.assignment["members"]
    info = raw.get("members", {}) if isinstance(raw, dict) else {}
    pending = result.assignment.get("pending_moves")
    extra = ("warm-ups",) if pending is not None else ()
    rows = [("member", "host", "active tasks", "standby tasks", *extra)]
    for member in members:
        host = info.get(member, {}).get("host", member) if isinstance(info.get(member), dict) else member
        row = (
            one_line(member),
            one_line(str(host)),
            str(result.stats.actives.get(member, 0)),
            str(result.stats.standbys.get(member, 0)),
        )
        rows.append(row + ((str(result.stats.warmups.get(member, 0)),) if pending is not None else ()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    counts = [result.stats.actives.get(m, 0) for m in members]
    spread = max(counts) - min(counts) if counts else 0
    s = result.stats
    lines += [
        "",
        f"epoch {result.assignment['epoch']}: tasks retained {s.kept}, moved warm {s.moved_warm}, "
        f"moved cold {s.moved_cold}, unassigned {s.unassigned}, balance spread {spread}",
    ]
    if pending is not None:
        lines += _pending_lines(pending, counts, list(members))
    revoking = result.assignment.get("revoking")
    if revoking is not None:
        lines += _revoking_lines(revoking, counts, list(members))
    lines += [f"warning: {one_line(w)}" for w in result.assignment["warnings"]]
    return "\n".join(lines)


def _revoking_lines(revoking: list[dict[str, Any]], counts: list[int], members: list[str]) -> list[str]:
    """A cooperative round: one line per task revoked now and assigned in the follow-up, after
    the balance spread once the follow-up has assigned them (the table counts them nowhere)."""
    if not revoking:
        return ["cooperative round: nothing revoked, no follow-up rebalance"]
    after = dict(zip(members, counts, strict=True))
    for move in revoking:
        after[move["to"]] = after.get(move["to"], 0) + 1
    spread = max(after.values()) - min(after.values()) if after else 0
    lines = [
        f"cooperative round: revoking {len(revoking)}, active nowhere until the follow-up "
        f"rebalance assigns them; balance spread after the follow-up {spread}"
    ]
    for move in revoking:
        task = one_line(f"{'+'.join(move['topics'])}#{move['partition']}")
        giver, taker = one_line(move["from"]), one_line(move["to"])
        lines.append(f"  {task}: revoked from {giver}, to {taker} in the follow-up")
    return lines


def _pending_lines(pending: list[dict[str, Any]], counts: list[int], members: list[str]) -> list[str]:
    """One line per move held until its target has caught up, after the balance spread the
    group reaches once they are all done (balance is promised of that target)."""
    target = dict(zip(members, counts, strict=True))
    for move in pending:
        target[move["from"]] = target.get(move["from"], 0) - 1
        target[move["to"]] = target.get(move["to"], 0) + 1
    spread = max(target.values()) - min(target.values()) if target else 0
    warming = sum(1 for move in pending if move["warmup"])
    lines = [
        f"pending moves {len(pending)} (warming up {warming}, waiting {len(pending) - warming}), "
        f"balance spread once done {spread}"
    ]
    for move in pending:
        how = "warm-up replica" if move["warmup"] else "waits for a warm-up slot"
        task = one_line(f"{'+'.join(move['topics'])}#{move['partition']}")
        giver, taker = one_line(move["from"]), one_line(move["to"])
        lines.append(f"  {task}: stays on {giver}, moves to {taker} once caught up ({how})")
    return lines
