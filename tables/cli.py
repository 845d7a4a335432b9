"""`tandem`: the project's commands under one name (the console script of pyproject.toml).

    tandem dev APP [--workers 2] ...        python -m tables.dev: your app on a local cluster
    tandem plan FILE|- [--summary]          python -m assignor plan: a scenario's assignment
    tandem what-if --worker URL ...         python -m assignor what-if: a change to a live group
    tandem pipeline JOB [...]               python -m pipeline: the Spark jobs (the `spark` extra)

Each subcommand hands its arguments to that module's own `main`, so the `python -m` forms and
these are one program. A command's module is imported only when it runs: `tandem plan` does
not import Faust, and only `tandem pipeline` needs PySpark.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tables._version import __version__


@dataclass(frozen=True)
class Command:
    module: str  # whose `main(argv)` runs the command
    help: str
    leading: tuple[str, ...] = ()  # arguments put before the user's (assignor's own subcommand)


COMMANDS: dict[str, Command] = {
    "dev": Command("tables.dev", "run your app locally: the embedded broker and N workers of it"),
    "plan": Command("assignor.cli", "plan an assignment for a scenario (JSON)", ("plan",)),
    "what-if": Command(
        "assignor.cli", "what a change would do to a live group (changes nothing)", ("what-if",)
    ),
    "pipeline": Command(
        "pipeline.__main__", "the batch side on Spark: join, reconcile, export, produce, ..."
    ),
}


def usage() -> str:
    lines = ["usage: tandem <command> [--help] [options]", "", "commands:"]
    lines += [f"  {name:<10} {command.help}" for name, command in COMMANDS.items()]
    lines += ["", "`tandem <command> --help` shows a command's options; `tandem --version` the version."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--version":
        print(f"tandem {__version__}")
        return 0
    if args and args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not args or args[0] not in COMMANDS:
        problem = f"tandem: unknown command {args[0]!r}\n" if args else ""
        print(problem + usage(), file=sys.stderr)
        return 2
    command = COMMANDS[args[0]]
    run: Callable[[list[str]], int] = importlib.import_module(command.module).main
    return int(run([*command.leading, *args[1:]]))


if __name__ == "__main__":
    sys.exit(main())
