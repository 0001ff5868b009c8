"""Writes the hostile-input corpus of tests/data/hostile/ (all folders but hlo/,
which has its own author) and each folder's expected.toml. Deterministic:
random bytes come from fixed seeds. Run from the repository root:

    python tests/data/hostile/make_corpus.py

Manifest format (shared with hlo/): one table per input,

    [files."NAME"]
    exit = 2                      # the documented exit code
    contains = "..."              # a substring of stdout + stderr
    args = ["check-jax", "{file}"]
    file = "other"                # optional: the input, when NAME is a label
    subprocess = true             # optional: run `python -m dlverify.cli`, not in-process

with {file} the input's absolute path, {dir} its folder, {tmp} a fresh
empty folder and {data} tests/data. tests/test_hostile.py runs every entry.
"""
from __future__ import annotations

import random
import shutil
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
EXAMPLES = ROOT / "examples"

CASE_HEADER = '''import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import dlverify

F32 = jnp.float32


def ident(x):
    return x


def sm(local, n=2, in_specs=(P("x"),), out_specs=P("x")):
    return jax.shard_map(local, mesh=dlverify.host_mesh((n,), ("x",)), in_specs=in_specs,
                         out_specs=out_specs)


def arg(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def ok(**kw):
    base = dict(seq=jnp.tanh, dist=sm(jnp.tanh), args=(arg(8, 4),))
    base.update(kw)
    return dlverify.Case(**base)
'''

TINY_SEQ = """HloModule tiny_seq, entry_computation_layout={(f32[8,4]{1,0})->f32[8,4]{1,0}}

ENTRY main {
  x = f32[8,4]{1,0} parameter(0)
  ROOT t = f32[8,4]{1,0} tanh(x)
}
"""
TINY_DIST = """HloModule tiny_dist, entry_computation_layout={(f32[4,4]{1,0})->f32[4,4]{1,0}}, num_partitions=2

ENTRY main {
  x = f32[4,4]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}
  ROOT t = f32[4,4]{1,0} tanh(x), sharding={devices=[2,1]<=[2]}
}
"""
GOOD_SPEC = "ranks = 2\n[params]\n0 = { split = 0 }\n[outputs]\n0 = { concat = 0 }\n"


class Folder:
    """One folder of the corpus and its manifest."""

    def __init__(self, name: str) -> None:
        self.dir = HERE / name
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.entries: list[str] = []

    def write(self, name: str, content: str | bytes) -> Path:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def expect(self, name: str, exit: int, args: list[str], contains: str = "",
               file: str | None = None, why: str = "", subprocess: bool = False) -> None:
        lines = [f"# {why}"] if why else []
        lines.append(f'[files."{name}"]')
        lines.append(f"exit = {exit}")
        if contains:
            lines.append(f"contains = {_toml_str(contains)}")
        lines.append("args = [" + ", ".join(_toml_str(a) for a in args) + "]")
        if file is not None:
            lines.append(f"file = {_toml_str(file)}")
        if subprocess:
            lines.append("subprocess = true")
        self.entries.append("\n".join(lines))

    def case(self, name: str, content: str | bytes, exit: int, contains: str = "",
             extra: list[str] | None = None, why: str = "") -> None:
        """A case file run with `check-jax`."""
        self.write(name, content)
        self.expect(name, exit, ["check-jax", "{file}", *(extra or [])], contains, why=why)

    def save(self, title: str) -> None:
        text = f"# {title}\n# Written by tests/data/hostile/make_corpus.py: edit that, not this.\n\n"
        (self.dir / "expected.toml").write_text(text + "\n\n".join(self.entries) + "\n")


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _random_bytes(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _case_body(body: str) -> str:
    return CASE_HEADER + "\n\n" + body.strip("\n") + "\n"


def _truncations(text: str, seed: int, count: int) -> list[tuple[int, str]]:
    """Cuts of `text` that are not valid Python (so the expected outcome is a
    syntax error, whatever the cut)."""
    rng = random.Random(seed)
    out: list[tuple[int, str]] = []
    tries = 0
    while len(out) < count and tries < 1000:
        tries += 1
        cut = rng.randrange(len(text) // 10, len(text) - 1)
        part = text[:cut]
        try:
            compile(part, "cut", "exec")
        except SyntaxError:
            out.append((cut, part))
    return out


def _toml_cuts(text: str) -> list[int]:
    """Cuts of `text` that are not valid TOML."""
    import tomllib

    out = []
    for cut in range(1, len(text)):
        try:
            tomllib.loads(text[:cut])
        except tomllib.TOMLDecodeError:
            out.append(cut)
    return out[:: max(1, len(out) // 6)][:6]


# ---------------------------------------------------------------------------

def cases() -> None:
    f = Folder("cases")
    run_ok = "summary: 1 case: 1 verified"

    # --- not Python at all, or broken Python
    f.case("empty.py", "", 2, "no @dlverify.case functions", why="an empty file")
    f.case("only_comment.py", "# nothing here\n", 2, "no @dlverify.case functions")
    f.case("no_cases.py", _case_body("X = 1"), 2, "no @dlverify.case functions")
    for i in range(8):
        f.case(f"random_bytes_{i}.py", _random_bytes(100 + i, 64 << i), 2, f"random_bytes_{i}.py",
               why="random bytes of growing size")
    f.case("null_bytes.py", b"import dlverify\x00\x00\n", 2, "null_bytes.py")
    f.case("latin1.py", "# caf\xe9\nx = '\xe9'\n".encode("latin-1"), 2, "latin1.py",
           why="not UTF-8 and no coding line")
    f.case("utf16.py", "import dlverify\n".encode("utf-16"), 2, "utf16.py")
    f.case("elf_header.py", b"\x7fELF\x02\x01\x01" + bytes(57) + _random_bytes(7, 300), 2,
           "elf_header.py")
    f.case("syntax_error.py", _case_body("def broken(:\n    pass"), 2, "syntax error")
    f.case("indentation.py", "def f():\nreturn 1\n", 2, "syntax error")
    f.case("deep_parens.py", "x = " + "(" * 300 + "1" + ")" * 300 + "\n", 2, "deep_parens.py",
           why="nesting beyond the parser's limit")
    f.case("deep_lists.py", "x = " + "[" * 5000 + "]" * 5000 + "\n", 2, "deep_lists.py")
    f.case("long_sum.py", "x = " + " + ".join(["1"] * 100_000) + "\n", 2, "long_sum.py",
           why="one 400 kB expression: compiling it recurses deeply")
    f.case("unterminated_string.py", 'x = """never closed\n', 2, "syntax error")
    for path in sorted(EXAMPLES.glob("*.py"))[:8]:
        for j, (cut, part) in enumerate(_truncations(path.read_text(), zlib.crc32(path.name.encode()), 3)):
            f.case(f"truncated_{path.stem}_{j}.py", part, 2, "syntax error",
                   why=f"examples/{path.name} cut at byte {cut}")

    # --- the file's code ends the process, or tries to
    exits = {
        "sys_exit_0": ("import sys\nsys.exit(0)", "called sys.exit(0)"),
        "sys_exit_1": ("import sys\nsys.exit(1)", "called sys.exit(1)"),
        "sys_exit_text": ("import sys\nsys.exit('bye')", "called sys.exit('bye')"),
        "raise_systemexit": ("raise SystemExit", "called sys.exit(None)"),
        "keyboard_interrupt": ("raise KeyboardInterrupt", "raised KeyboardInterrupt"),
        "os_exit": ("import os\nos._exit(0)", "exited with code 0"),
        "kill_self": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
        "segfault": ("import ctypes\nctypes.string_at(0)", "SIGSEGV"),
        "abort": ("import os\nos.abort()", "SIGABRT"),
        "import_missing": ("import no_such_module_for_dlverify", "ModuleNotFoundError"),
        "raise_at_import": ("raise RuntimeError('boom')", "importing failed: RuntimeError: boom"),
        "recursion_at_import": ("def f():\n    return f()\nf()", "RecursionError"),
    }
    for name, (code, contains) in exits.items():
        f.case(f"import_{name}.py", _case_body(code + "\n\n@dlverify.case\ndef c():\n    return ok()"),
               2, contains, why=f"at import time: {contains}")
    in_case = {
        "sys_exit_0": ("import sys; sys.exit(0)", "called sys.exit(0)"),
        "raise_systemexit": ("raise SystemExit(3)", "called sys.exit(3)"),
        "keyboard_interrupt": ("raise KeyboardInterrupt", "raised KeyboardInterrupt"),
        "os_exit": ("import os; os._exit(3)", "exited with code 3"),
        "kill_self": ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
        "segfault": ("import ctypes; ctypes.string_at(0)", "SIGSEGV"),
        "recursion": ("c()", "RecursionError"),
        "raise": ("raise ValueError('no')", "failed to build: ValueError: no"),
        "alarm": ("import signal, time; signal.alarm(1); time.sleep(30)", "SIGALRM"),
    }
    for name, (code, contains) in in_case.items():
        f.case(f"case_{name}.py", _case_body(f"@dlverify.case\ndef c():\n    {code}\n    return ok()"),
               2, contains, why=f"inside the case function: {contains}")
    f.case("case_exit_in_seq.py", _case_body(
        "import sys\n\ndef seq(x):\n    sys.exit(0)\n\n@dlverify.case\ndef c():\n    return ok(seq=seq)"),
        2, "called sys.exit(0)", why="sys.exit while JAX traces the user's function")
    f.case("case_raise_in_seq.py", _case_body(
        "def seq(x):\n    raise ValueError('in seq')\n\n@dlverify.case\ndef c():\n    return ok(seq=seq)"),
        2, "ValueError: in seq")
    f.case("case_shape_error_in_seq.py", _case_body(
        "def seq(x):\n    return x @ x\n\n@dlverify.case\ndef c():\n    return ok(seq=seq)"),
        2, "case_shape_error_in_seq.py:")

    # --- what a case returns
    returns = {"none": "None", "int": "42", "tuple": "(jnp.tanh, jnp.tanh, ())",
               "dict": "{'seq': jnp.tanh}", "case_class": "dlverify.Case", "string": "'case'"}
    for name, value in returns.items():
        f.case(f"returns_{name}.py", _case_body(f"@dlverify.case\ndef c():\n    return {value}"),
               2, "not dlverify.Case")
    f.case("returns_generator.py", _case_body("@dlverify.case\ndef c():\n    yield ok()"), 2,
           "returned generator")
    f.case("returns_coroutine.py", _case_body("@dlverify.case\nasync def c():\n    return ok()"),
           2, "returned coroutine")
    f.case("case_needs_argument.py", _case_body("@dlverify.case\ndef c(x):\n    return ok()"), 2,
           "failed to build: TypeError")
    f.case("expect_maybe.py", _case_body("@dlverify.case\ndef c():\n    return ok(expect='maybe')"),
           2, "expect must be 'verified' or 'bug'")
    f.case("expect_bool.py", _case_body("@dlverify.case\ndef c():\n    return ok(expect=True)"), 2,
           "expect must be 'verified' or 'bug'")
    f.case("expect_list.py", _case_body("@dlverify.case\ndef c():\n    return ok(expect=['bug'])"),
           2, "expect must be 'verified' or 'bug'")
    f.case("seq_not_callable.py", _case_body("@dlverify.case\ndef c():\n    return ok(seq=42)"), 2,
           "seq must be a function")
    f.case("dist_not_callable.py", _case_body("@dlverify.case\ndef c():\n    return ok(dist='x')"),
           2, "dist must be a function")

    # --- args
    bad_args = {
        "string": ("('abc',)", "argument 0 is a str"),
        "object": ("(object(),)", "argument 0 is a object"),
        "not_tuple_struct": ("arg(8, 4)", "args must be a tuple"),
        "not_tuple_int": ("5", "args must be a tuple"),
        "not_tuple_dict": ("{'x': arg(8, 4)}", "args must be a tuple"),
        "not_tuple_none": ("None", "args must be a tuple"),
        "dim_2_31": ("(arg(2**31, 4),)", "every dimension must be an integer in 0..2147483647"),
        "dim_2_40": ("(arg(2**40, 2**40),)", "every dimension must be an integer"),
        "string_dtype": ("(np.array(['a', 'b']),)", "expected a numeric or boolean dtype"),
        "object_dtype": ("(np.array([object(), 1], dtype=object),)", "dtype"),
        "nested_strings": ("((arg(8, 4), ['x']),)", "is a str"),
    }
    for name, (value, contains) in bad_args.items():
        f.case(f"args_{name}.py", _case_body(f"@dlverify.case\ndef c():\n    return ok(args={value})"),
               2, contains, why=f"args = {value}")
    f.case("args_negative_dim.py", _case_body("@dlverify.case\ndef c():\n    return ok(args=(arg(-1, 4),))"),
           2, "args_negative_dim.py")
    f.case("args_deep_nesting.py", _case_body(
        "def nest(n):\n    x = arg(8, 4)\n    for _ in range(n):\n        x = (x,)\n    return x\n\n"
        "@dlverify.case\ndef c():\n    return ok(args=(nest(20000),))"), 2, "args_deep_nesting.py",
        why="a pytree 20,000 deep")
    f.case("args_too_few.py", _case_body("@dlverify.case\ndef c():\n    return ok(args=())"), 2,
           "args_too_few.py")

    # --- meshes and shardings
    f.case("mesh_16_devices.py", _case_body("@dlverify.case\ndef c():\n    return ok(dist=sm(jnp.tanh, n=16), args=(arg(16, 4),))"),
           2, "needs 16 devices")
    f.case("mesh_1e9_devices.py", _case_body("@dlverify.case\ndef c():\n    return ok(dist=sm(jnp.tanh, n=10**9))"),
           2, "needs 1000000000 devices")
    f.case("mesh_zero.py", _case_body("@dlverify.case\ndef c():\n    return ok(dist=sm(jnp.tanh, n=0))"),
           2, "mesh_zero.py")
    f.case("unknown_axis.py", _case_body("@dlverify.case\ndef c():\n    return ok(dist=sm(jnp.tanh, in_specs=(P('y'),)))"),
           2, "'y'")
    f.case("not_divisible.py", _case_body("@dlverify.case\ndef c():\n    return ok(args=(arg(5, 4),))"),
           2, "divisible")

    # --- limits (exit 3), in every phase
    f.case("loop_at_import.py", _case_body("while True:\n    pass"), 3, "out of time",
           ["--timeout", "2"], why="an endless loop while the file is imported")
    f.case("loop_in_case.py", _case_body("@dlverify.case\ndef c():\n    while True:\n        pass"),
           3, "out of time", ["--timeout", "2"])
    f.case("loop_in_seq.py", _case_body(
        "def seq(x):\n    while True:\n        pass\n\n@dlverify.case\ndef c():\n    return ok(seq=seq)"),
        3, "out of time", ["--timeout", "2"], why="an endless loop while JAX traces")
    f.case("sleep_in_case.py", _case_body("import time\n\n@dlverify.case\ndef c():\n    time.sleep(600)"),
           3, "out of time", ["--timeout", "2"])
    f.case("memory_at_import.py", _case_body("HOG = bytearray(8 * 2**30)"), 3, "out of memory",
           ["--max-memory", "1G"], why="8 GB at import under a 1 GB limit")
    f.case("memory_in_case.py", _case_body(
        "@dlverify.case\ndef c():\n    hog = [bytearray(2**20) for _ in range(4096)]\n    return ok()"),
        3, "out of memory", ["--max-memory", "1G"])
    f.case("memory_numpy_in_case.py", _case_body(
        "@dlverify.case\ndef c():\n    hog = np.ones((2**31,), np.float32)\n    return ok()"),
        3, "out of memory", ["--max-memory", "1G"])

    # --- odd but harmless: the run still works
    f.case("prints_a_lot.py", _case_body(
        "print('x' * 200_000)\n\n@dlverify.case\ndef c():\n    print('noise')\n    return ok()"),
        0, '"schema_version"', ["--json"], why="prints go to stderr: the JSON report stays valid")
    f.case("closes_stdout.py", _case_body("import sys\nsys.stdout.close()\n\n@dlverify.case\ndef c():\n    return ok()"),
           0, run_ok)
    f.case("changes_cwd.py", _case_body("import os\nos.chdir('/')\n\n@dlverify.case\ndef c():\n    return ok()"),
           0, run_ok)
    f.case("thread_forever.py", _case_body(
        "import threading, time\nthreading.Thread(target=lambda: time.sleep(10**6)).start()\n\n"
        "@dlverify.case\ndef c():\n    return ok()"), 0, run_ok, why="a non-daemon thread never ends")
    f.case("unicode_name.py", _case_body("@dlverify.case\ndef случай():\n    return ok()"), 0, run_ok)
    f.case("expects_bug_but_verifies.py", _case_body("@dlverify.case\ndef c():\n    return ok(expect='bug')"),
           1, "MISMATCH")
    f.case("marker_on_non_callable.py", _case_body("X = 5\nsetattr(dlverify, 'unused', 1)"), 2,
           "no @dlverify.case functions")
    f.write("tiny.py", _case_body("@dlverify.case\ndef c():\n    return ok()"))
    f.expect("target_unknown_case", 2, ["check-jax", "{file}::nope"], "no case named 'nope'",
             file="tiny.py")
    f.expect("target_empty_case_name", 0, ["check-jax", "{file}::"], run_ok, file="tiny.py")
    f.expect("target_missing_file", 2, ["check-jax", "{dir}/no_such_file.py"], "no such file",
             file="tiny.py")
    f.expect("target_directory", 2, ["check-jax", "{dir}"], "not a file", file="tiny.py")
    f.expect("target_dev_null", 2, ["check-jax", "/dev/null"], "not a file", file="tiny.py")
    f.save("check-jax on hostile case files")


def specs() -> None:
    f = Folder("specs")
    f.write("seq.hlo", TINY_SEQ)
    f.write("dist.hlo", TINY_DIST)
    f.write("good.toml", GOOD_SPEC)
    args = ["check", "{dir}/seq.hlo", "{dir}/dist.hlo", "--spec", "{file}"]

    def spec(name: str, content: str | bytes, exit: int, contains: str = "", why: str = "") -> None:
        f.write(name, content)
        f.expect(name, exit, args, contains, why=why)

    f.expect("good_spec", 0, args, "summary: 1 module pair: 1 verified", file="good.toml",
             why="the control: this pair verifies under this spec")
    for i in range(6):
        spec(f"random_{i}.toml", _random_bytes(200 + i, 40 << i), 2, f"random_{i}.toml")
    for j, cut in enumerate(_toml_cuts(GOOD_SPEC)):
        spec(f"truncated_{j}.toml", GOOD_SPEC[:cut], 2, f"truncated_{j}.toml",
             why=f"the good spec cut at byte {cut}")
    spec("utf16.toml", GOOD_SPEC.encode("utf-16"), 2, "utf16.toml")
    spec("latin1.toml", "# caf\xe9\n".encode("latin-1") + GOOD_SPEC.encode(), 2, "latin1.toml")
    spec("null_byte.toml", GOOD_SPEC.encode() + b"\x00", 2, "null_byte.toml")
    spec("unclosed_table.toml", "ranks = 2\n[params\n0 = 'replicated'\n", 2, "unclosed_table.toml")
    spec("duplicate_key.toml", "ranks = 2\nranks = 3\n", 2, "duplicate_key.toml")
    spec("deep_arrays.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n", 2, "deep_arrays.toml",
         why="arrays nested 5,000 deep")
    spec("deep_tables.toml", "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n", 2,
         "deep_tables.toml", why="inline tables nested 3,000 deep")
    absurd_ranks = {"zero": "0", "negative": "-1", "float": "2.5", "huge_float": "1e300",
                    "nan": "nan", "inf": "inf", "string": '"two"', "bool": "true",
                    "array": "[2]", "billions": "99999999999", "just_over": "65537",
                    "int64_max": "9223372036854775807"}
    for name, value in absurd_ranks.items():
        spec(f"ranks_{name}.toml", f"ranks = {value}\n[params]\n0 = {{ split = 0 }}\n", 2,
             f"ranks_{name}.toml", why=f"ranks = {value}")
    bad_params = {
        "key_not_int": 'x = "replicated"',
        "key_negative": '-1 = "replicated"',
        "key_beyond": '99 = "replicated"',
        "key_huge": '99999999999999999999 = "replicated"',
        "kind_unknown": '0 = "sideways"',
        "kind_int": "0 = 7",
        "split_negative": "0 = { split = -1 }",
        "split_beyond_rank": "0 = { split = 9 }",
        "split_string": '0 = { split = "0" }',
        "split_float": "0 = { split = 0.5 }",
        "segments_empty": "0 = { split = 0, segments = [] }",
        "segments_zero": "0 = { split = 0, segments = [0, 8] }",
        "segments_wrong_sum": "0 = { split = 0, segments = [2, 2] }",
        "segments_huge": "0 = { split = 0, segments = [99999999999999999999] }",
        "segments_strings": '0 = { split = 0, segments = ["a"] }',
        "unknown_field": "0 = { split = 0, colour = 1 }",
        "dist_negative": "0 = { split = 0, dist = -1 }",
        "dist_beyond": "0 = { split = 0, dist = 9 }",
        "dist_string": '0 = { split = 0, dist = "0" }',
        "rank0_false": "0 = { rank0_only = false }",
        "rank0_of_a_split": '0 = "rank0_only"',
        "pad_unknown": '0 = { split = 0, pad = "ones" }',
        "pad_bool": "0 = { split = 0, pad = true }",
        "pad_with_segments": '0 = { split = 0, segments = [4, 4], pad = "zero" }',
        "reshaped_string": '0 = { split = 0, reshaped = "yes" }',
        "reshaped_with_pad": '0 = { split = 0, reshaped = true, pad = "any" }',
        "reshaped_rank0": "0 = { rank0_only = true, reshaped = true }",
        "reshaped_wrong_count": "0 = { replicated = true, reshaped = true }",
        "params_array": None,
    }
    for name, line in bad_params.items():
        body = "ranks = 2\nparams = [1, 2]\n" if line is None else f"ranks = 2\n[params]\n{line}\n"
        spec(f"params_{name}.toml", body, 2, f"params_{name}.toml", why=line or "params = [1, 2]")
    bad_outputs = {"concat_beyond": "0 = { concat = 9 }", "garbage": '0 = "garbage"',
                   "key_beyond": '5 = { concat = 0 }', "concat_negative": "0 = { concat = -2 }"}
    for name, line in bad_outputs.items():
        spec(f"outputs_{name}.toml", f"ranks = 2\n[params]\n0 = {{ split = 0 }}\n[outputs]\n{line}\n",
             2, f"outputs_{name}.toml", why=line)
    bad_dist_params = {"beyond": '9 = "rank_id"', "kind_unknown": '0 = "sideways"',
                       "value_string": '0 = { value = "x" }', "value_bool": "0 = { value = true }",
                       "rank_id_of_a_float": '0 = "rank_id"', "table_array": None}
    for name, line in bad_dist_params.items():
        body = ("ranks = 2\ndist_params = [1]\n" if line is None
                else f"ranks = 2\n[dist_params]\n{line}\n")
        spec(f"dist_params_{name}.toml", body, 2, f"dist_params_{name}.toml",
             why=line or "dist_params = [1]")
    spec("ranks_mismatch.toml", "ranks = 4\n[params]\n0 = { split = 0 }\n", 2, "ranks_mismatch.toml",
         why="4 ranks for a module partitioned in 2")
    spec("huge_string.toml", 'ranks = 2\nnote = "' + "x" * 300_000 + '"\n[params]\n0 = { split = 0 }\n',
         2, "huge_string.toml", why="a 300 kB string under an unknown key")
    f.expect("spec_is_directory", 2, ["check", "{dir}/seq.hlo", "{dir}/dist.hlo", "--spec", "{dir}"],
             "--spec: not a file", file="good.toml")
    f.expect("spec_missing", 2, ["check", "{dir}/seq.hlo", "{dir}/dist.hlo", "--spec",
                                 "{dir}/missing.toml"], "--spec: no such file", file="good.toml")
    f.save("check --spec with hostile relation specs (over a small pair that verifies)")


def custom_calls() -> None:
    f = Folder("custom_calls")
    f.write("seq.hlo", TINY_SEQ)
    f.write("dist.hlo", TINY_DIST)
    args = ["check", "{dir}/seq.hlo", "{dir}/dist.hlo", "--custom-calls", "{file}"]
    for i in range(4):
        name = f"random_{i}.toml"
        f.write(name, _random_bytes(300 + i, 100 << i))
        f.expect(name, 2, args, name)
    bad = {
        "invalid_toml": "[custom_call\n",
        "entry_not_table": 'MyCall = "elementwise"\n',
        "deep_nesting": "x = " + "[" * 5000 + "]" * 5000 + "\n",
        "utf16": None,
    }
    for name, content in bad.items():
        data = "[MyCall]\nkind = 'elementwise'\n".encode("utf-16") if content is None else content
        f.write(f"{name}.toml", data)
        f.expect(f"{name}.toml", 2, args, f"{name}.toml")
    f.expect("registry_is_directory", 2, ["check", "{dir}/seq.hlo", "{dir}/dist.hlo",
                                          "--custom-calls", "{dir}"], "--custom-calls: not a file",
             file="seq.hlo")
    f.save("check --custom-calls with hostile custom-call registries")


def options() -> None:
    f = Folder("options")
    f.write("tiny.py", _case_body("@dlverify.case\ndef c():\n    return ok()"))
    f.write("bug.py", _case_body("@dlverify.case\ndef c():\n    return ok(dist=sm(lambda x: x * 2.0), expect='bug')"))
    f.write("seq.hlo", TINY_SEQ)
    f.write("dist.hlo", TINY_DIST)
    jax_args = ["check-jax", "{dir}/tiny.py"]
    hlo_args = ["check", "{dir}/seq.hlo", "{dir}/dist.hlo"]

    def opt(name: str, extra: list[str], exit: int, contains: str, base: list[str] = jax_args,
            file: str = "tiny.py", why: str = "") -> None:
        f.expect(name, exit, [*base, *extra], contains, file=file, why=why)

    for value, label in (("-1", "negative"), ("0", "zero"), ("nan", "nan"), ("inf", "inf"),
                         ("-inf", "minus_inf"), ("1e300", "huge"), ("1e8", "over_a_century")):
        opt(f"timeout_{label}", ["--timeout", value], 2, "--timeout", why=f"--timeout {value}")
    opt("timeout_not_a_number", ["--timeout", "soon"], 2, "Invalid value for '--timeout'")
    opt("timeout_tiny", ["--timeout", "1e-300"], 3, "out of time",
        why="a valid limit that no run can meet")
    opt("timeout_hlo_tiny", ["--timeout", "1e-9"], 3, "out of time", base=hlo_args)
    f.expect("timeout_in_a_real_process", 3, [*jax_args, "--timeout", "0.5"], "out of time",
             file="tiny.py", subprocess=True,
             why="python -m dlverify.cli: the deadline holds while the fork server starts")
    for value, label in (("-1", "negative"), ("0", "zero"), ("1e300", "huge"), ("lots", "word"),
                         ("4X", "bad_unit"), ("1K", "too_small"), ("nan", "nan"), ("", "empty"),
                         ("G", "unit_only"), ("1e30T", "huge_terabytes")):
        opt(f"max_memory_{label}", ["--max-memory", value], 2, "--max-memory",
            why=f"--max-memory {value!r}")
    opt("max_memory_ok", ["--max-memory", "4G"], 0, "summary: 1 case: 1 verified")
    opt("max_memory_too_low", ["--max-memory", "64M"], 3, "out of memory",
        why="JAX cannot even start in 64 MB")
    for value, label in (("0", "zero"), ("-1", "negative"), ("99999999999", "billions"),
                         ("65537", "just_over")):
        opt(f"ranks_{label}", ["--ranks", value], 2, "--ranks", base=hlo_args)
    opt("ranks_word", ["--ranks", "two"], 2, "Invalid value for '--ranks'", base=hlo_args)
    opt("engine_unknown", ["--engine", "prolog"], 2, "unknown engine 'prolog'")
    opt("engine_empty", ["--engine", ""], 2, "unknown engine ''")
    opt("unknown_option", ["--frobnicate"], 2, "--frobnicate")
    for option in ("--sarif", "--junit", "--graph"):
        o = option.strip("-")
        opt(f"{o}_directory", [option, "{tmp}"], 2, f"{option}: is a directory")
        opt(f"{o}_under_a_file", [option, "{dir}/tiny.py/out.x"], 2, f"{option}: the folder")
        opt(f"{o}_missing_folder", [option, "{tmp}/no/such/folder/out.x"], 2, f"{option}: the folder")
        opt(f"{o}_proc", [option, "/proc/dlverify-out.x"], 2, f"{option}: cannot write here")
        opt(f"{o}_hlo_directory", [option, "{tmp}"], 2, f"{option}: is a directory", base=hlo_args)
    opt("keep_facts_is_a_file", ["--keep-facts", "{dir}/tiny.py"], 2, "--keep-facts: exists and is not a folder")
    opt("keep_facts_proc", ["--keep-facts", "/proc/dlverify-facts"], 2, "--keep-facts: cannot write here")
    opt("keep_facts_under_a_file", ["--keep-facts", "{dir}/tiny.py/facts"], 2, "--keep-facts")
    for value, label in (("out0@99", "rank_99"), ("out0@2", "rank_2")):
        opt(f"explain_{label}", ["--explain", value], 2, "does not exist", why="the program has 2 ranks")
        opt(f"explain_hlo_{label}", ["--explain", value], 2, "does not exist", base=hlo_args)
    for value, label in (("@", "at_only"), ("out0@", "no_rank"), ("out0@-1", "negative_rank"),
                         ("out0@x", "word_rank"), ("", "empty"), ("out0@1@2", "two_ats")):
        opt(f"explain_{label}", ["--explain", value], 2, "--explain")
    opt("explain_unknown_output", ["--explain", "logits"], 2, "no output named 'logits'")
    opt("check_missing_seq", [], 2, "no such file", base=["check", "{dir}/nope.hlo", "{dir}/dist.hlo"])
    opt("check_seq_is_directory", [], 2, "not a file", base=["check", "{dir}", "{dir}/dist.hlo"])
    opt("dump_is_a_file", [], 2, "not a directory", base=["check-dump", "{dir}/tiny.py"])
    opt("graph_for_a_bug", ["--graph", "{tmp}/g.dot"], 0, "1 bug found as expected",
        file="bug.py", base=["check-jax", "{dir}/bug.py"])
    f.save("hostile command-line options: absurd numbers, unwritable paths, bad targets")


def dumps() -> None:
    f = Folder("dumps")
    args = ["check-dump", "{file}"]
    f.write("empty/.keep", "")
    f.expect("empty", 2, args, "no module dumped before optimisations")
    f.write("only_other_files/notes.txt", "hello\n")
    f.expect("only_other_files", 2, args, "no module dumped before optimisations")
    f.write("before_only/module_0001.jit_f.before_optimizations.txt", TINY_SEQ)
    f.expect("before_only", 2, args, "no SPMD-partitioned module")
    f.write("random_modules/module_0001.jit_f.before_optimizations.txt", _random_bytes(400, 2000))
    f.write("random_modules/module_0001.jit_f.sm_8.0_gpu_after_optimizations.txt",
            b"HloModule x, num_partitions=2\n" + _random_bytes(401, 2000))
    f.expect("random_modules", 2, args, "random_modules")
    f.write("huge_partitions/module_0001.jit_f.before_optimizations.txt", TINY_SEQ)
    f.write("huge_partitions/module_0001.jit_f.after_optimizations.txt",
            TINY_DIST.replace("num_partitions=2", "num_partitions=99999999999"))
    f.expect("huge_partitions", 2, args, "huge_partitions", why="num_partitions=99999999999")
    f.write("truncated_after/module_0001.jit_f.before_optimizations.txt", TINY_SEQ)
    f.write("truncated_after/module_0001.jit_f.after_optimizations.txt", TINY_DIST[:150])
    f.expect("truncated_after", 2, args, "truncated_after")
    f.write("good/module_0001.jit_f.before_optimizations.txt", TINY_SEQ)
    f.write("good/module_0001.jit_f.after_optimizations.txt", TINY_DIST)
    f.write("good/module_0002.jit_g.before_optimizations.txt", TINY_SEQ)
    f.write("good/module_0002.jit_g.after_optimizations.txt", TINY_DIST)
    f.expect("good", 0, args, "summary: 2 module pairs: 2 verified", why="the control: two modules")
    f.expect("good_graph_per_module", 0, [*args, "--graph", "{tmp}/g.dot", "--json"], '"schema_version"',
             file="good")
    f.save("check-dump over hostile XLA dump folders")


def patterns() -> None:
    f = Folder("patterns")  # over the case and modules of options/ (written before)
    args = ["check-jax", "{data}/hostile/options/bug.py", "--patterns", "{file}"]
    one = '[[pattern]]\nname = "{name}"\nregex = "{regex}"\nexplanation = "e"\n'
    f.write("good.toml", one.format(name="mul-output", regex="mul&output"))
    f.expect("good", 0, args, "pattern mul-output: e (mul at", file="good.toml",
             why="the control: a user pattern matched on the expected bug")
    for i in range(3):
        name = f"random_{i}.toml"
        f.write(name, _random_bytes(400 + i, 100 << i))
        f.expect(name, 2, args, name)
    bad = {
        "invalid_toml": ("[[pattern]\nname = 'x'\n", "not valid TOML"),
        "utf16": (one.format(name="x", regex="mul").encode("utf-16"), "not UTF-8"),
        "deep_nesting": ("x = " + "[" * 5000 + "]" * 5000 + "\n", "deep_nesting.toml"),
        "empty": ("", "expected one or more [[pattern]] tables"),
        "pattern_not_a_table": ("pattern = 3\n", "expected one or more [[pattern]] tables"),
        "unknown_table": (one.format(name="x", regex="mul") + "[extra]\n", "unknown table or key 'extra'"),
        "unknown_key": (one.format(name="x", regex="mul") + "severity = 'high'\n", "unknown key 'severity'"),
        "missing_explanation": ('[[pattern]]\nname = "x"\nregex = "mul"\n', "missing key 'explanation'"),
        "regex_not_a_string": ('[[pattern]]\nname = "x"\nregex = 3\nexplanation = "e"\n', "regex must be a string"),
        "bad_name": (one.format(name="Has Spaces", regex="mul"), "pattern name 'Has Spaces'"),
        "unknown_label": (one.format(name="x", regex="partial frobnicate"), "unknown label 'frobnicate'"),
        "unknown_negated_label": (one.format(name="x", regex="!frobnicate&mul"), "unknown label 'frobnicate'"),
        "empty_label": (one.format(name="x", regex="partial&"), "unknown label ''"),
        "unbalanced_parenthesis": (one.format(name="x", regex="(partial mul"), "malformed regex"),
        "lone_star": (one.format(name="x", regex="*"), "malformed regex"),
        "empty_regex": (one.format(name="x", regex=" "), "empty regex"),
        "matches_empty_path": (one.format(name="x", regex="mul*"), "matches the empty path"),
        "backslash": ('[[pattern]]\nname = "x"\nregex = \'mul\\\\*\'\nexplanation = "e"\n', "without backslashes"),
        "huge_regex": (one.format(name="x", regex=" ".join(["mul"] * 700)), "at most 2000 characters"),
        "exponential_dfa": (one.format(name="x", regex="(mul|add)* mul " + " ".join(["(mul|add)"] * 24)),
                            "grows beyond 2000 states"),
        "defined_twice": (one.format(name="x", regex="mul") + one.format(name="x", regex="add"), "defined twice"),
        "shadows_shipped": (one.format(name="scaled-output", regex="mul"), "already defined"),
    }
    for name, (content, contains) in bad.items():
        f.write(f"{name}.toml", content)
        f.expect(f"{name}.toml", 2, args, contains)
    f.expect("patterns_missing", 2, [*args[:3], "{dir}/missing.toml"], "--patterns: no such file",
             file="good.toml")
    f.expect("patterns_is_directory", 2, [*args[:3], "{dir}"], "--patterns: not a file",
             file="good.toml")
    f.expect("check_with_bad_patterns", 2, ["check", "{data}/hostile/options/seq.hlo",
                                            "{data}/hostile/options/dist.hlo", "--patterns", "{file}"],
             "unknown label 'frobnicate'",
             file="unknown_label.toml", why="check (HLO) checks --patterns before it runs")
    f.expect("check_dump_with_bad_patterns", 2, ["check-dump", "{dir}", "--patterns", "{file}"],
             "malformed regex", file="lone_star.toml", why="check-dump too")
    f.expect("zoo_with_bad_patterns", 2, ["zoo", "{data}/hostile/options/bug.py", "--patterns", "{file}",
                                          "--cache-dir", "{tmp}/cache", "--report-dir", "{tmp}/report"],
             "unknown label 'frobnicate'", file="unknown_label.toml", why="zoo too, before any item runs")
    f.save("check-jax, check, check-dump --patterns with hostile bug-pattern files")


if __name__ == "__main__":
    cases()
    specs()
    custom_calls()
    options()
    dumps()
    patterns()
    total = sum(p.read_text().count('[files."') for p in HERE.glob("*/expected.toml"))
    print(f"wrote {total} manifest entries under {HERE}")
