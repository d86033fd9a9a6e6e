"""The notebook magics' names: one set, each a line and a cell magic
(%cuda_watch, %cuda_guard, %cuda_launch_blocking; %launch_blocking kept as an
old name), and messages that name the magic as it was typed. In IPython's
InteractiveShell, in a child with the fake CUDA driver (the scopes open)."""
from conftest import needs

SHELL = '''
from IPython.core.interactiveshell import InteractiveShell
import cuda_debug
shell = InteractiveShell.instance()
def cell(source):
    return shell.run_cell(source, store_history=True)
cell("%load_ext cuda_debug")
shell.user_ns["cuda_debug"] = cuda_debug
'''


def test_every_magic_is_a_line_and_a_cell_magic(fake_child):
    needs("IPython")
    c = fake_child(SHELL + '''
magics = shell.magics_manager.magics
names = ["cuda_watch", "cuda_guard", "cuda_launch_blocking", "launch_blocking"]
report(dict(line=[n for n in names if n in magics["line"]],
            cell=[n for n in names if n in magics["cell"]]))
cell("%unload_ext cuda_debug")
report(dict(left=[n for n in names if n in magics["line"] or n in magics["cell"]]))
''')
    results = [line for line in c.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 2, c
    import json
    first, second = (json.loads(r[len("RESULT "):]) for r in results)
    names = ["cuda_watch", "cuda_guard", "cuda_launch_blocking", "launch_blocking"]
    assert first == {"line": names, "cell": names}
    assert second == {"left": []}


def test_cell_magics_run_one_cell_in_their_mode(fake_child):
    needs("IPython")
    c = fake_child(SHELL + '''
rs = [cell("%%cuda_watch\\nw = cuda_debug.is_watching()\\nw"),
      cell("%%cuda_launch_blocking\\nb = cuda_debug.is_launch_blocking()\\nb"),
      cell("%%cuda_guard\\ng = cuda_debug.is_guarding()\\ng"),
      cell("%%launch_blocking\\nold = cuda_debug.is_launch_blocking()\\nold"),
      cell("after = (cuda_debug.is_watching(), cuda_debug.is_launch_blocking(), "
           "cuda_debug.is_guarding())")]
report(dict(results=[r.result for r in rs[:4]], errors=[repr(r.error_in_exec) for r in rs
                                                        if not r.success],
            after=shell.user_ns["after"]))
''')
    r = c.result
    assert r is not None, c
    assert r == {"results": [True, True, True, True], "errors": [],
                 "after": [False, False, False]}, r


def test_messages_name_the_magic_as_typed(fake_child):
    needs("IPython")
    c = fake_child(SHELL + '''
rs = [cell("%cuda_launch_blocking on"), cell("on = cuda_debug.is_launch_blocking()"),
      cell("%cuda_launch_blocking off"), cell("%launch_blocking"),
      cell("%cuda_launch_blocking sideways"), cell("%launch_blocking sideways"),
      cell("%%cuda_watch now\\n1")]
report(dict(on=shell.user_ns["on"], errors=[str(r.error_in_exec) for r in rs if not r.success]))
''')
    r = c.result
    assert r is not None, c
    assert r["on"] is True
    out = c.stdout
    # one form for every magic's state, the magic as typed; alone it switches (as %pdb)
    assert out.splitlines()[:3] == ["cuda_launch_blocking: on", "cuda_launch_blocking: off",
                                    "launch_blocking: on"], out
    usage = out + c.stderr + " ".join(r["errors"])
    assert "usage: %cuda_launch_blocking [on|off] [--all-threads]" in usage, usage
    assert "usage: %launch_blocking [on|off] [--all-threads]" in usage, usage
    assert "%%cuda_watch takes no arguments, not now" in usage, usage


def test_a_bare_line_magic_switches_its_mode_as_pdb_does(fake_child):
    """`%cuda_watch` alone turns watching on, then off (IPython's %pdb habit),
    and every magic prints its state in one form."""
    needs("IPython")
    c = fake_child(SHELL + '''
seen = []
for source in ["%cuda_watch", "%cuda_watch", "%cuda_guard", "%cuda_guard",
               "%cuda_launch_blocking", "%cuda_launch_blocking", "%cuda_launch_blocking on",
               "%cuda_launch_blocking --all-threads", "%cuda_launch_blocking off"]:
    r = cell(source)
    seen.append([r.success, cuda_debug.is_watching(), cuda_debug.is_guarding()])
report(dict(seen=seen))
''')
    r = c.result
    assert r is not None, c
    assert [s[0] for s in r["seen"]] == [True] * 9, r
    assert [s[1] for s in r["seen"][:2]] == [True, False], r
    assert [s[2] for s in r["seen"][2:4]] == [True, False], r
    assert c.stdout.splitlines()[:9] == [
        "cuda_watch: on", "cuda_watch: off", "cuda_guard: on", "cuda_guard: off",
        "cuda_launch_blocking: on", "cuda_launch_blocking: off", "cuda_launch_blocking: on",
        "cuda_launch_blocking: on (all threads)", "cuda_launch_blocking: off"], c.stdout


def test_line_magics_take_the_words_the_variables_take(fake_child):
    """%cuda_guard yes / no, as CUDA_DEBUG_GUARD=yes takes them (they were
    refused); every word of _options' booleans, either case."""
    needs("IPython")
    c = fake_child(SHELL + '''
states = []
for word in ["yes", "no", "ON", "0", "true", "False", "1", "off"]:
    r = cell("%cuda_guard " + word)
    states.append([r.success, cuda_debug.is_guarding()])
report(dict(states=states))
''')
    assert c.result == {"states": [[True, True], [True, False], [True, True], [True, False],
                                   [True, True], [True, False], [True, True],
                                   [True, False]]}, c
