"""What the commands of the command line share: exit statuses, the parser of a
command, the usage error, the parsing of a program's command line (``run``
and ``replay`` take one as ``python`` does), and the lines they print.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import argparse
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

EXIT_ERROR, EXIT_USAGE, EXIT_STICKY, EXIT_NOT_REPRODUCED = 1, 2, 3, 4
MODULE_PROG = "python -m cuda_debug"


def _parser(prog: str, command: str, description: str) -> argparse.ArgumentParser:
    """A command's parser: named as typed (``cuda-debug run``), options in full
    (no abbreviations: ``--size`` is not ``--sizes``)."""
    return argparse.ArgumentParser(prog="%s %s" % (prog, command), allow_abbrev=False,
                                   description=description)



class UsageError(Exception):
    """A command line its command refuses: said as argparse says it (the usage,
    then ``PROG CMD: error: message``), exit status 2."""


def _is_module_name(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def _usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    """As argparse says it: the usage, then ``PROG CMD: error: message`` (the
    command as typed: ``cuda-debug`` or ``python -m cuda_debug``)."""
    parser.print_usage(sys.stderr)
    sys.stderr.write("%s: error: %s\n" % (parser.prog, message))
    return EXIT_USAGE


#: a valued option of run or replay: (its key, convert(option, value or None))
_Valued = Dict[str, Tuple[str, Callable[[str, Optional[str]], Any]]]


class Program:
    """A command line of run or replay, parsed: our options (`opts`), then the
    program (`target`: a script, a module when `module`, or - for stdin) and its
    own arguments (`args`). `help`: -h or --help came before the program."""

    def __init__(self, opts: Dict[str, Any]):
        self.opts = opts
        self.target: Optional[str] = None
        self.module = False
        self.command = False            # -c: `target` is the program's text
        self.args: List[str] = []
        self.help = False


def _parse_program(argv: List[str], opts: Dict[str, Any], flags: Dict[str, str],
                   valued: _Valued) -> Program:
    """Parsed by hand, like `python` does: our options come before the script (or
    -m module, -c code, or - for stdin); everything after it is the script's,
    --help included. Our options are spelled out in full (no abbreviations); a
    valued one as ``--opt value`` or ``--opt=value``. UsageError for what is
    refused."""
    p = Program(opts)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            p.help = True
            return p
        name, eq, value = a.partition("=")
        if a in flags:
            p.opts[flags[a]] = True
        elif a in valued:
            key, convert = valued[a]
            p.opts[key] = convert(a, argv[i + 1] if i + 1 < len(argv) else None)
            i += 1
        elif eq and a.startswith("--") and name in valued:
            key, convert = valued[name]
            p.opts[key] = convert(name, value)
        elif a in ("-m", "-c") or (a[:2] in ("-m", "-c") and len(a) > 2):
            p.target = a[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
            p.module, p.command = a[:2] == "-m", a[:2] == "-c"
            p.args = argv[i + (1 if a[2:] else 2):]
            break
        elif a in ("--", "-") or not a.startswith("-"):
            j = i + 1 if a == "--" else i
            p.target, p.args = (argv[j], argv[j + 1:]) if j < len(argv) else (None, [])
            _not_the_interpreter(p)
            break
        else:
            raise UsageError("unknown option %s (options go before the script; the script's "
                             "own after it)" % a)
        i += 1
    if not p.target:
        raise UsageError("-m needs a module name" if p.module else
                         "-c needs the program's text" if p.command else
                         "a script (or -m module) is required")
    if p.module and not _is_module_name(p.target):
        raise UsageError("-m %s: not a module name (dotted Python identifiers, as python -m "
                         "takes; for a file, leave out -m)" % p.target)
    return p


def _not_the_interpreter(p: Program) -> None:
    """``run python train.py``: the command already is python (a usage error
    that says what was meant)."""
    name = os.path.basename(p.target or "")
    if p.args and (name == os.path.basename(sys.executable) or
                   name.rstrip("0123456789.") in ("python", "python.exe")) and \
            not os.path.isfile(p.target or ""):
        raise UsageError("%s: run runs the program with this Python itself: leave it out "
                         "(run %s)" % (p.target, " ".join(p.args)))


def _check_program_file(p: Program) -> None:
    """The script must be there (not checked when only parsing)."""
    if p.module or p.command or p.target == "-" or p.target is None:
        return
    if not os.path.exists(p.target):
        raise UsageError("no such file: %s" % p.target)


def _program(parse: Callable[[List[str]], Program], parser: argparse.ArgumentParser,
             argv: List[str]) -> Tuple[Optional[Program], int]:
    """(the program `parse` found in `argv`, its script there, 0), or (None, the
    exit status) once --help is printed (0) or a usage error said (2)."""
    try:
        p = parse(argv)
        if p.help:
            parser.print_help()
            return None, 0
        _check_program_file(p)
    except UsageError as e:
        return None, _usage_error(parser, str(e))
    return p, 0



def _program_words(target: str, args: List[str], module: bool, command: bool) -> List[str]:
    """The program as python's command line spells it: ``script args...``,
    ``-m module args...`` or ``-c code args...``."""
    return (["-m", target] if module else ["-c", target] if command else [target]) + list(args)


def _ranked(text: str) -> str:
    """Every line prefixed ``[rank k] `` when RANK is set (torchrun)."""
    rank = os.environ.get("RANK")
    if rank in (None, ""):
        return text
    return "\n".join("[rank %s] %s" % (rank, line) for line in text.splitlines())



def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write("%s\n" % code)
    return EXIT_ERROR
