"""`python -m assignor plan` and `what-if` on hostile input (issue 36, finding 8): no input
makes them print a traceback. The planner is total (docs/scenario-format.md): `plan` answers
bad input with warnings and the best valid assignment, exit 0; `what-if` answers a malformed
group.json with one line and exit 2; labels print with control characters escaped.

Both run as the user runs them (a subprocess); what-if reads a real HTTP server's group.json.
"""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from assignor import plan

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, stdin: str | bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run(
        [sys.executable, "-m", "assignor", *args],
        input=data,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def owned(assignment: dict[str, Any]) -> dict[str, list[int]]:
    """topic -> partitions with an active owner or listed as unassigned."""
    found: dict[str, list[int]] = {}
    for member in assignment["members"].values():
        for topic, partitions in member["active"].items():
            found.setdefault(topic, []).extend(partitions)
    for topic, partitions in assignment["unassigned"].items():
        found.setdefault(topic, []).extend(partitions)
    return {t: sorted(p) for t, p in found.items()}


# ---------------------------------------------------------------- plan


def test_a_capacity_of_1e400_written_as_an_integer_gets_every_task_placed() -> None:
    """Before: an internal error, and an assignment with no owners and nothing unassigned."""
    text = (
        '{"topics": {"a": 4}, "members": {"m1": {"topics": ["a"], "capacity": 1%s}, "m2": {"topics": ["a"]}}}'
    )
    done = run("plan", "-", stdin=text % ("0" * 400))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert owned(out) == {"a": [0, 1, 2, 3]}
    assert out["members"]["m1"]["active"] == {"a": [0, 1, 2, 3]}  # its share is all of it
    assert not any("internal planner error" in w for w in out["warnings"]), out["warnings"]


@pytest.mark.parametrize("scale", [10**400, 10**4000], ids=["1e400", "1e4000"])
@pytest.mark.parametrize("warmups", [False, True])
def test_huge_integer_capacities_are_planned_exactly_or_with_a_warning(scale: int, warmups: bool) -> None:
    """Standbys and warm-ups too: every float the planner takes of a capacity holds."""
    scenario: dict[str, Any] = {
        "topics": {"a": 4, "cl": 4, "b": 3},
        "copartition_groups": [["a", "cl"]],
        "changelog_topics": ["cl"],
        "standby_replicas": 1,
        "members": {
            "m1": {"topics": ["a", "cl", "b"], "capacity": scale, "previous_active": {"a": [0, 1]}},
            "m2": {"topics": ["a", "cl"], "capacity": scale // 3},
            "m3": {"topics": ["b"], "capacity": 1},
        },
    }
    if warmups:
        scenario["acceptable_recovery_lag"] = 10
    out = plan(scenario)
    assert owned(out) == {"a": [0, 1, 2, 3], "b": [0, 1, 2], "cl": [0, 1, 2, 3]}
    assert not any("internal planner error" in w for w in out["warnings"]), out["warnings"]
    assert any("'m3': capacity more than 2**500" in w for w in out["warnings"])
    standbys = sorted(p for m in out["members"].values() for p in m["standby"].get("cl", []))
    assert standbys == [0, 1, 2, 3]


def test_a_5000_digit_integer_is_a_warning_not_a_traceback() -> None:
    text = '{"topics": {"a": 2}, "members": {"m1": {"topics": ["a"], "capacity": 1%s, "epoch": -%s}}}'
    done = run("plan", "-", stdin=text % ("0" * 5000, "9" * 6000))
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr[-500:]
    out = json.loads(done.stdout)
    assert out["members"]["m1"]["active"] == {"a": [0, 1]}
    warned = "\n".join(out["warnings"])
    assert "capacity <an integer of 5,001 digits> is not positive" in warned
    assert "epoch <an integer of 6,000 digits>" in warned


def test_the_highest_epoch_the_input_reads_plus_one_still_prints() -> None:
    """4,300 digits in (Python's limit), 4,301 out: the JSON writer refused it."""
    text = '{"topics": {"a": 1}, "members": {"m": {"topics": ["a"], "epoch": %s}}}' % ("9" * 4300)
    for args in (("plan", "-"), ("plan", "--summary", "-")):
        done = run(*args, stdin=text)
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr[-500:]
        assert b"1" + b"0" * 4300 in done.stdout


def test_a_file_that_is_not_utf8_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "scenario.json"
    path.write_bytes(b'{"topics": {"\xff": 1}}')
    done = run("plan", str(path))
    assert done.returncode == 0 and b"Traceback" not in done.stderr
    assert "not UTF-8" in json.loads(done.stdout)["warnings"][0]


def test_the_summary_escapes_control_characters_in_labels() -> None:
    scenario = {"topics": {"a": 2}, "members": {"m\x1b[2J1": {"topics": ["a"], "host": "h\nfake line"}}}
    done = run("plan", "--summary", "-", stdin=json.dumps(scenario))
    assert done.returncode == 0
    assert b"\x1b" not in done.stdout and b"m\\x1b[2J1" in done.stdout
    assert b"h\\nfake line" in done.stdout


# ---------------------------------------------------------------- what-if


class Served:
    """A real HTTP server on 127.0.0.1 answering /tandem/group.json with `body`."""

    body: bytes = b"{}"

    def __init__(self) -> None:
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the http.server name)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(served.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served() -> Iterator[Served]:
    server = Served()
    yield server
    server.close()


TOPICS = ["app-imp", "app-clk"]
CHANGELOG = "app-j-changelog"


def _view(name: str, actives: list[int], standbys: list[int]) -> dict[str, Any]:
    held = {t: actives for t in [*TOPICS, CHANGELOG]}
    return {
        "worker": name,
        "epoch": 4,
        "joins": {"j": {"inputs": TOPICS, "changelog": CHANGELOG, "actives": actives}},
        "planner": {
            "joins": [{"topics": TOPICS, "changelog": CHANGELOG}],
            "table_changelogs": [],
            "standby_replicas": 1,
            "acceptable_recovery_lag": 10_000,
        },
        "member": {
            "id": f"member-{name}",
            "topics": TOPICS,
            "epoch": 4,
            "url": f"http://{name}",
            "host": f"host-{name}",
            "rack": "",
            "capacity": 1.0,
            "previous_active": held,
            "previous_standby": {CHANGELOG: standbys},
            "local_offsets": {CHANGELOG: {str(p): 50 for p in range(6)}},
        },
    }


def group() -> dict[str, Any]:
    a, b = _view("a", [0, 1, 2], [3, 4, 5]), _view("b", [3, 4, 5], [0, 1, 2])
    return {
        "workers": [{"url": "http://a", "ok": True, "view": a}, {"url": "http://b", "ok": True, "view": b}],
        "routing": {"epoch": 4, "groups": [{"topics": sorted([*TOPICS, CHANGELOG]), "partitions": 6}]},
    }


def _broken(change: Any) -> bytes:
    found = copy.deepcopy(group())
    change(found)
    return json.dumps(found).encode()


MALFORMED: dict[str, bytes] = {
    "a list": b"[1, 2]",
    "an empty object": b"{}",
    "not JSON": b"<html>oops</html>",
    "deep nesting": b"[" * 100_000,
    "workers not a list": _broken(lambda g: g.update(workers=5)),
    "a worker without a view": _broken(lambda g: g["workers"][0].pop("view")),
    "a capacity that is text": _broken(lambda g: g["workers"][0]["view"]["member"].update(capacity="x")),
    "claims that are not lists": _broken(
        lambda g: g["workers"][0]["view"]["member"].update(previous_active={"t": 5})
    ),
    "an epoch that is text": _broken(lambda g: g["workers"][1]["view"]["member"].update(epoch="\x1b[2Jabc")),
    "routing groups not a list": _broken(lambda g: g["routing"].update(groups={"x": 1})),
    "offsets keyed by text": _broken(
        lambda g: g["workers"][0]["view"]["member"].update(local_offsets={CHANGELOG: {"p": "q"}})
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_what_if_answers_a_malformed_group_with_one_line_and_exit_2(served: Served, name: str) -> None:
    served.body = MALFORMED[name]
    done = run("what-if", "--worker", served.url, "--leave", "a")
    assert done.returncode == 2, (done.returncode, done.stdout[-300:], done.stderr[-800:])
    err = done.stderr.decode()
    assert err.startswith("what-if: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "\x1b" not in err


def test_what_if_prints_labels_with_control_characters_escaped(served: Served) -> None:
    found = group()
    for worker in found["workers"]:
        view = worker["view"]
        view["worker"] = view["worker"] + "\x1b[2J\x07"
        view["member"]["host"] = "host\nwarning: forged line"
        view["joins"]["j\x1b]0;title\x07"] = view["joins"].pop("j")
    served.body = json.dumps(found).encode()
    done = run("what-if", "--worker", served.url, "--leave", "a\x1b[2J\x07")
    assert done.returncode == 0, done.stderr[-800:]
    out = done.stdout.decode()
    assert "\x1b" not in out and "\x07" not in out
    assert "a\\x1b[2J\\x07" in out and "host\\nwarning: forged line" in out
    assert not any(line.startswith("warning: forged") for line in out.splitlines())


def test_what_if_answers_a_server_that_does_not_speak_http_with_one_line_and_exit_2() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_garbage() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"\x1b[2Jnot http at all\r\n\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    try:
        done = run("what-if", "--worker", f"http://127.0.0.1:{port}", "--leave", "a")
    finally:
        listener.close()
    err = done.stderr.decode()
    assert (
        done.returncode == 2 and err.startswith("what-if: cannot read the group") and err.count("\n") == 1
    ), err
    assert "\x1b" not in err
