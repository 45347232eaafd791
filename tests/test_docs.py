"""The documentation stays true to the code: every `krex` command in the README's code blocks parses with
krex's own command line (click, nothing run), every link into docs/ resolves (anchors too), every KREX_*
variable the code reads, every option of every command and every controller config key is in the
reference, the measurement pages' generated tables match their JSON, bench/results holds summaries only,
and every script a make target runs exists. Fast, and needs no GPU."""

import dataclasses
import importlib
import json
import pkgutil
import re
import shlex
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README] + sorted(DOCS.rglob("*.md"))


def krex_group() -> click.Group:
    """krex's click group with every subcommand added, as `krex` itself builds it (krex_ctl.cli.full)."""
    group = importlib.import_module("krex_ctl.cli").full()
    assert isinstance(group, click.Group) and group.commands, "krex_ctl.cli.cli has no subcommands"
    return group


def parse(argv: list) -> None:
    """Parse `krex ARGS...` as the command line would, without running anything; click's errors propagate."""
    group = krex_group()
    assert argv and argv[0] == "krex"
    root = click.Context(group, info_name="krex")
    name, rest = argv[1], argv[2:]
    cmd = group.get_command(root, name)
    if cmd is None:
        raise click.UsageError(f"no such command {name!r}", ctx=root)
    cmd.make_context(name, list(rest), parent=root)


SHELL_BLOCK = re.compile(r"^```([\w+-]*)\n(.*?)^```", re.S | re.M)   # every fenced block; shell ones parsed
SHELLS = ("", "sh", "bash", "shell", "console")
OPERATORS = {"&&", "||", ";", "|", "&", ";;"}


def krex_commands(text: str) -> list:
    """Each `krex ...` command of the shell code blocks: one per segment between shell operators, leading
    VAR=value assignments dropped; comments and line continuations handled as a shell would."""
    out = []
    for m in SHELL_BLOCK.finditer(text):
        if m.group(1) not in SHELLS:
            continue
        body = m.group(2).replace("\\\n", " ")
        for line in body.splitlines():
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            lex.commenters = "#"
            try:
                tokens = list(lex)
            except ValueError:      # an unclosed quote: a multi-line argument (python -c '...')
                tokens = shlex.split(line.split("'")[0], comments=True)
            segment: list = []
            for tok in tokens + [";"]:
                if tok in OPERATORS:
                    while segment and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", segment[0]):
                        segment.pop(0)
                    if segment and segment[0] == "krex":
                        out.append(segment)
                    segment = []
                else:
                    segment.append(tok)
    return out


def test_readme_is_short():
    assert README.stat().st_size <= 12 * 1024, f"README.md is {README.stat().st_size} bytes; move detail to docs/"


def test_every_krex_command_in_the_readme_parses():
    commands = krex_commands(README.read_text())
    assert {c[1] for c in commands} >= {"run", "status"}, commands   # the README shows both
    for c in commands:
        try:
            parse(c)
        except click.ClickException as e:
            pytest.fail(f"README: `{shlex.join(c)}` does not parse: {e.format_message()}")


@pytest.mark.parametrize("page", [p for p in PAGES if p != README], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_krex_command_in_the_docs_parses(page):
    for c in krex_commands(page.read_text()):
        try:
            parse(c)
        except click.ClickException as e:
            pytest.fail(f"{page.relative_to(ROOT)}: `{shlex.join(c)}` does not parse: {e.format_message()}")


def test_the_parser_used_here_refuses_what_krex_refuses():
    for bad in (["krex", "run", "--bogus", "--", "true"], ["krex", "nosuch"], ["krex", "status", "--jsn"],
                ["krex", "controller", "--no-such-flag"]):
        with pytest.raises(click.ClickException):
            parse(bad)
    parse(["krex", "run", "--gpu", "0,1", "--report", "r.json", "--", "torchrun", "--nproc_per_node", "2", "x.py"])
    assert krex_commands("```sh\nA=1 krex run -- x &   # c\nkrex status && krex run -- y | z\n```\n") == \
        [["krex", "run", "--", "x"], ["krex", "status"], ["krex", "run", "--", "y"]]


def slug(heading: str) -> str:
    """The anchor a Markdown heading gets (GitHub's rule: lower case, punctuation dropped, spaces to -)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(page: Path) -> list:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return [m.group(1) for m in LINK.finditer(text)]


def test_the_readme_links_into_docs():
    targets = {(README.parent / t.split("#")[0]).resolve() for t in links(README) if not t.startswith("http")}
    for part in ("guide", "reference", "design", "measurements"):
        assert any(DOCS / part in t.parents for t in targets), f"README links nothing in docs/{part}/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue                       # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.relative_to(ROOT)}: link {target} -> {dest} does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.relative_to(ROOT)}: no heading #{anchor} in {dest.name}"


def krex_variables_read() -> set:
    """Every KREX_* name the code reads: quoted whole in the Python of krex/, krex_ctl/ and hooks/ (getenv,
    os.environ, env.get, and the tuples of names those read), and in the C of shim/ and tests/fakes/."""
    names = set()
    for d in ("krex", "krex_ctl", "hooks"):
        for f in (ROOT / d).rglob("*.py"):
            names |= set(re.findall(r"(?<![fFrRbB])[\"'](KREX_[A-Z0-9_]*[A-Z0-9])[\"']", f.read_text()))
    for f in list((ROOT / "shim").glob("*.c")) + list((ROOT / "tests" / "fakes").glob("*.c")):
        names |= set(re.findall(r"\"(KREX_[A-Z0-9_]*[A-Z0-9])\"", f.read_text()))
    return names


def test_every_variable_of_the_slurm_scripts_is_in_the_reference():
    names = set()
    for f in (ROOT / "packaging" / "slurm").iterdir():
        if f.is_file():
            names |= set(re.findall(r"\b(KREX_[A-Z0-9_]*[A-Z0-9])\b", f.read_text()))
    assert {"KREX_CLI", "KREX_SLURM_MODE", "KREX_EPILOG_GRACE_S"} <= names, names
    table = (DOCS / "reference" / "environment.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in table)
    assert not missing, f"not in docs/reference/environment.md: {', '.join(missing)}"


def test_every_krex_variable_the_code_reads_is_in_the_reference():
    names = krex_variables_read()
    assert {"KREX_SOCKET", "KREX_HOOKS", "KREX_GATE_MEMORY", "KREX_FAKE_TRACE"} <= names, names
    table = (DOCS / "reference" / "environment.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in table)
    assert not missing, f"not in docs/reference/environment.md: {', '.join(missing)}"


def test_every_option_of_every_command_is_in_the_reference():
    ref = (DOCS / "reference" / "cli.md").read_text()
    for name, cmd in krex_group().commands.items():
        assert re.search(rf"^## `krex {name}\b", ref, re.M), f"docs/reference/cli.md has no section for krex {name}"
        section = ref.split(f"## `krex {name}", 1)[1].split("\n## ", 1)[0]
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("-"):
                    assert f"`{opt}" in section, f"krex {name} {opt} is not in docs/reference/cli.md"


def test_every_device_script_setting_and_the_driven_bench_options_are_in_the_reference():
    """docs/reference/benchmarks.md names every setting a tests/gpu script reads (`${NAME:-default}`) and every
    option of the benchmark scripts those settings drive there."""
    ref = (DOCS / "reference" / "benchmarks.md").read_text()
    settings = set()
    for script in (ROOT / "tests" / "gpu").glob("*.sh"):
        settings |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):-", script.read_text()))
    settings -= {"EPOCH"}          # overlap_search_h200.sh's own, read from the search's result
    missing = sorted(n for n in settings if f"`{n}`" not in ref)
    assert not missing, f"not in docs/reference/benchmarks.md: {', '.join(missing)}"
    for script in ("freeze_policy.py", "overlap_search.py", "overlap_proxy.py"):
        calls = (ROOT / "bench" / script).read_text().split("add_argument(")[1:]
        opts = {re.match(r'"(--[a-z-]+)"', c).group(1) for c in calls
                if re.match(r'"--', c) and "argparse.SUPPRESS" not in c.split("add_argument", 1)[0]}
        gone = sorted(o for o in opts if f"`{o}" not in ref)
        assert not gone, f"bench/{script}: not in docs/reference/benchmarks.md: {', '.join(gone)}"


def controller_config():
    try:
        return importlib.import_module("krex_ctl.config").Config
    except (ImportError, AttributeError):
        pass
    import krex_ctl
    for m in pkgutil.walk_packages(krex_ctl.__path__, "krex_ctl."):
        mod = importlib.import_module(m.name)
        cfg = getattr(mod, "Config", None)
        if dataclasses.is_dataclass(cfg) and "region_time_limit_s" in {f.name for f in dataclasses.fields(cfg)}:
            return cfg
    pytest.fail("no controller Config dataclass found in krex_ctl")


def test_every_config_key_is_in_the_reference():
    ref = (DOCS / "reference" / "config.md").read_text()
    missing = [f.name for f in dataclasses.fields(controller_config()) if f"| `{f.name}` |" not in ref]
    assert not missing, f"not in docs/reference/config.md: {', '.join(missing)}"


def test_the_measurement_tables_match_their_json():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        tables = importlib.import_module("measurement_tables")
    finally:
        sys.path.remove(str(ROOT / "bench"))
    blocks = 0
    for page in tables.pages():
        text = page.read_text()
        blocks += text.count("<!-- table: ")
        assert tables.regenerate(text) == text, \
            f"{page.relative_to(ROOT)} is out of date: run python bench/measurement_tables.py"
    assert blocks > 0


def test_bench_results_hold_summaries_only():
    files = [f for f in (ROOT / "bench" / "results").rglob("*") if f.is_file()]
    raw = [f.name for f in files if re.search(r"\.(tgz|tar|tar\.gz|log|csv)$", f.name)]
    assert not raw, f"raw logs or archives in bench/results: {raw}"
    total = sum(f.stat().st_size for f in files)
    assert total < 4 * 1024 * 1024, f"bench/results holds {total} bytes"
    # JSON results are kept without indentation (a quarter of their size was whitespace); a trace that is not one
    # JSON document (Chrome's format allows a missing "]") is left as written
    indented = []
    for f in files:
        if f.suffix == ".json":
            text = f.read_text()
            try:
                data = json.loads(text)
            except ValueError:
                continue
            if len(text.strip()) > len(json.dumps(data, separators=(",", ":"), ensure_ascii=False)):
                indented.append(f.name)
    assert not indented, f"indented JSON in bench/results (rewrite with separators=(',', ':')): {indented}"


def test_every_script_a_make_target_runs_exists():
    makefile = (ROOT / "Makefile").read_text()
    scripts = set(re.findall(r"\b((?:bench|examples|tests)/[\w/.-]+\.(?:py|sh))\b", makefile))
    assert scripts, "no script found in the Makefile"
    missing = sorted(s for s in scripts if not (ROOT / s).exists())
    assert not missing, f"the Makefile runs scripts that do not exist: {missing}"
