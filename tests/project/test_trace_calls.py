"""scripts/trace_calls.py (issue 41, "following vlret eval from the CLI to the metrics"): its
places, returns and calls out on a toy package whose call chain is counted by hand, and the
start of a real command's path at the command's ``run``. Nothing is timed."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    from trace_calls import CallTracer, Entry, trace_command
finally:
    sys.path.remove(str(ROOT / "scripts"))

TOY = {
    "__init__.py": "",
    "c.py": """
        def leaf(x=0):
            return x


        def gen():
            for i in range(3):
                yield leaf(i)  # the same file: no entry


        def calls_back():
            from toypkg import b

            return b.one()
        """,
    "b.py": """
        from toypkg import c


        def one():
            return c.leaf()


        def two():
            return sum(c.gen())  # one activation, resumed three times
        """,
    "a.py": """
        from toypkg import b, c


        def main():
            b.one()
            b.two()
            for _ in range(3):
                c.leaf()  # one call site, three calls
            helper()
            import toypkg.d  # noqa: F401  (its body runs now: not the path)
            list(map(c.leaf, [1, 2]))  # through a builtin: a's call
            c.calls_back()
            return 0


        def helper():
            return c.leaf()
        """,
    "d.py": """
        from toypkg import c

        VALUE = c.leaf(5)
        """,
}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    pkg = tmp_path / "toypkg"
    pkg.mkdir()
    for name, text in TOY.items():
        (pkg / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "toypkg" or m.startswith("toypkg.")]:
        monkeypatch.delitem(sys.modules, name)
    a = importlib.import_module("toypkg.a")
    yield pkg, a
    for name in [m for m in sys.modules if m == "toypkg" or m.startswith("toypkg.")]:
        del sys.modules[name]


def line_of(pkg: Path, name: str, text: str) -> int:
    lines = (pkg / name).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_every_call_between_files_is_an_entry_once_per_call_site(toy):
    pkg, a = toy
    tracer = CallTracer(pkg)
    assert tracer.run(a.main) == 0
    trace = tracer.trace
    at = {n: lambda text, n=n: line_of(pkg, n, text) for n in ("a.py", "b.py", "c.py")}
    expected = {
        Entry(None, 0, "toypkg/a.py", "main"): 1,
        Entry("toypkg/a.py", at["a.py"]("b.one()"), "toypkg/b.py", "one"): 1,
        Entry("toypkg/b.py", at["b.py"]("c.leaf()"), "toypkg/c.py", "leaf"): 2,  # a, then c
        Entry("toypkg/a.py", at["a.py"]("b.two()"), "toypkg/b.py", "two"): 1,
        Entry("toypkg/b.py", at["b.py"]("c.gen()"), "toypkg/c.py", "gen"): 1,
        Entry("toypkg/a.py", at["a.py"]("c.leaf()  # one"), "toypkg/c.py", "leaf"): 3,
        Entry("toypkg/a.py", at["a.py"]("return c.leaf()"), "toypkg/c.py", "leaf"): 1,
        Entry("toypkg/a.py", at["a.py"]("map(c.leaf"), "toypkg/c.py", "leaf"): 2,
        Entry("toypkg/a.py", at["a.py"]("c.calls_back()"), "toypkg/c.py", "calls_back"): 1,
        Entry("toypkg/c.py", at["c.py"]("b.one()"), "toypkg/b.py", "one"): 1,
    }
    assert trace.calls == expected
    assert list(trace.calls) == list(expected)  # in the order first made
    # a entered once, b three times, c six times (its call sites): 3 places, 10 - 3 returns
    assert trace.counts == {"toypkg/a.py": 1, "toypkg/b.py": 3, "toypkg/c.py": 6}
    assert (trace.places, trace.returns) == (3, 7)
    report = trace.report()
    assert "places: 3" in report and "returns: 7" in report and " x3" in report


def test_a_file_off_the_path_is_a_call_out_and_nothing_below_it_counts(toy):
    pkg, a = toy
    tracer = CallTracer(pkg, follows=lambda file: not file.endswith("/c.py"))
    tracer.run(a.main)
    trace = tracer.trace
    # c's calls back into b (calls_back -> b.one -> c.leaf) are below a call out: not counted
    assert [(e.caller, e.file, e.function) for e in trace.calls] == [
        (None, "toypkg/a.py", "main"),
        ("toypkg/a.py", "toypkg/b.py", "one"),
        ("toypkg/a.py", "toypkg/b.py", "two"),
    ]
    assert (trace.places, trace.returns) == (2, 1)
    assert [(e.caller, e.function, n) for e, n in trace.outside.items()] == [
        ("toypkg/b.py", "leaf", 1),
        ("toypkg/b.py", "gen", 1),
        ("toypkg/a.py", "leaf", 3),
        ("toypkg/a.py", "leaf", 1),
        ("toypkg/a.py", "leaf", 2),
        ("toypkg/a.py", "calls_back", 1),
    ]
    assert "calls out: 6 call sites into 1 file(s)" in trace.report()


def test_stop_is_a_place_with_nothing_followed_below_it(toy):
    pkg, a = toy
    tracer = CallTracer(pkg, stop="toypkg/b.py:two")
    tracer.run(a.main)
    functions = [(e.file, e.function) for e in tracer.trace.calls]
    assert ("toypkg/b.py", "two") in functions and ("toypkg/c.py", "gen") not in functions
    assert (tracer.trace.places, tracer.trace.returns) == (3, 6)


def test_the_start_skips_what_comes_before_it(toy):
    pkg, a = toy
    tracer = CallTracer(pkg, starts=lambda file, function, caller, caller_fn: function == "two")
    tracer.run(a.main)
    assert [(e.caller, e.file, e.function) for e in tracer.trace.calls] == [
        (None, "toypkg/b.py", "two"),
        ("toypkg/b.py", "toypkg/c.py", "gen"),
    ]


def test_a_command_starts_at_its_run(capsys):
    status, trace = trace_command(["protocols"])
    assert status == 0 and "f30k" in capsys.readouterr().out
    first = trace.entries[0]
    assert (first.caller, first.file, first.function) == (None, "vlret/cli/protocols.py", "run")
    # the parser (every command's add_parser) is not the path; the registry is a call out
    assert all(e.file.startswith("vlret/cli/") for e in trace.entries)
    assert any(e.file.startswith("vlret/eval/") for e in trace.outside)
