"""The documentation stays true: citations of the method specification resolve, nothing points outside the
repository, and the commands, links and size of README.md and docs/*.md match the code (docs that cannot rot)."""
import functools
import glob
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".txt", ".toml", ".ini", ".cfg", ".sh"}


def repo_files():
    skip = {".git", "output", "datasets", "__pycache__", ".pytest_cache", ".ruff_cache"}
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if (path.is_file() and not skip & set(rel.parts) and not rel.parts[0].startswith(".venv")
                and (path.suffix in SUFFIXES or path.name == "Makefile")):
            yield rel, path.read_text(encoding="utf-8", errors="replace")


def test_every_cited_method_anchor_exists():
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', (ROOT / "docs" / "method.md").read_text()))
    assert {"model", "training", "meta-step", "losses", "dataparallel", "transforms", "results"} <= anchors
    cited = {}
    for rel, text in repo_files():
        for line in text.splitlines():
            if "method.md" in line:   # 'docs/method.md#basic-step, #meta-step' cites both
                for anchor in re.findall(r"#([a-z0-9][a-z0-9-]*)", line.split("method.md", 1)[1]):
                    cited.setdefault(anchor, str(rel))
    assert len(cited) >= 15
    missing = {a: f for a, f in cited.items() if a not in anchors}
    assert not missing, missing


def test_nothing_refers_to_files_outside_the_repository():
    outside = [str(rel) for rel, text in repo_files()
               if rel != Path("tests/test_docs.py") and ("../shared" in text or "shared/reference" in text)]
    assert not outside, outside


# ------------------------------------------------------------------ docs that cannot rot
# Every command in a ```bash block of README.md and docs/*.md must name files, make targets, config keys and
# command-line flags that exist; every relative link in the Markdown files must resolve (file and anchor); the
# README stays a short guide. Each check reports the file, the line and what is missing.
README_WORD_BUDGET = 1500
SOURCE_DIRS = ("bench", "compat", "configs", "docs", "reid", "tests", "tools")
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
CONFIG_KEY = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z][A-Z0-9_]*)+$")
REPO_PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*[\w*])" % "|".join(SOURCE_DIRS))
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def markdown_files():
    return [ROOT / "README.md", ROOT / "CHANGELOG.md"] + sorted((ROOT / "docs").glob("*.md"))


def shell_commands(text):
    """(line number, command) for every command of the ```bash blocks of a Markdown text; continuation lines
    joined, several commands on a line (&&, ;, |) split."""
    for match in FENCE.finditer(text):
        if match.group(1) not in SHELL_BLOCKS:
            continue
        first = text.count("\n", 0, match.start(2)) + 1
        pending, start = "", None
        for offset, line in enumerate(match.group(2).splitlines()):
            start = first + offset if start is None else start
            if line.rstrip().endswith("\\"):
                pending += line.strip()[:-1].strip() + " "
                continue
            for command in re.split(r"\s(?:&&|\|\||;|\|)\s", pending + line.strip()):
                if command.strip() and not command.strip().startswith("#"):
                    yield start, command.strip()
            pending, start = "", None


@functools.lru_cache(maxsize=None)
def make_targets():
    """The Makefile's targets as make reads them, rules written through $(eval ...) included (make -p prints its
    database; -q runs nothing)."""
    out = subprocess.run(["make", "-pRrq", "-f", "Makefile", ":"], cwd=str(ROOT), capture_output=True, text=True,
                         timeout=120)
    return set(re.findall(r"^([A-Za-z0-9_.\-/]+):(?![=:])", out.stdout, re.M))


@functools.lru_cache(maxsize=None)
def config_keys():
    from reid.config import get_cfg

    def walk(node, prefix):
        for key, value in node.items():
            name = prefix + key
            yield name
            if isinstance(value, dict):
                yield from walk(value, name + ".")
    return set(walk(get_cfg(), ""))


@functools.lru_cache(maxsize=None)
def flags_of(program):
    """The long options a script or `-m module` of this repository accepts, read from its --help."""
    args = ["-m", program[3:]] if program.startswith("-m ") else [program]
    out = subprocess.run([sys.executable] + args + ["--help"], cwd=str(ROOT), capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, "%s --help failed: %s" % (program, out.stderr[-500:])
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", out.stdout))


def repo_path_exists(path):
    return bool(glob.glob(str(ROOT / path))) if "*" in path else (ROOT / path).exists()


def module_file(module):
    base = ROOT.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__main__.py") if p.exists()), None)


def command_problems(command):
    """What a shell command names that does not exist: files, make targets, config keys, flags."""
    problems = []
    try:
        tokens = shlex.split(command, comments=True)
    except ValueError as exc:
        return ["cannot be parsed (%s)" % exc]
    while tokens and ASSIGNMENT.match(tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return problems
    for token in tokens:
        for path in REPO_PATH.findall(token):
            if not repo_path_exists(path):
                problems.append("%s does not exist" % path)
    program, args = None, tokens[1:]
    if tokens[0] == "make":
        for target in args:
            if not target.startswith("-") and "=" not in target and target not in make_targets():
                problems.append("make has no target %r (Makefile)" % target)
        return list(dict.fromkeys(problems))
    if re.match(r"^(\S*/)?python[0-9.]*$", tokens[0]) and args:
        if args[0] == "-m" and len(args) > 1:
            if args[1].split(".")[0] in SOURCE_DIRS:
                if module_file(args[1]) is None:
                    problems.append("module %s does not exist" % args[1])
                else:
                    program = "-m " + args[1]
            args = args[2:]
        elif args[0].endswith(".py"):
            if not (ROOT / args[0]).exists():
                problems.append("%s does not exist" % args[0])
            else:
                program = args[0]
            args = args[1:]
    elif tokens[0].endswith(".py") or tokens[0].endswith(".sh"):
        if not (ROOT / tokens[0]).exists():
            problems.append("%s does not exist" % tokens[0])
    if program is not None:
        known = flags_of(program)
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag.startswith("--") and flag not in known:
                problems.append("%s has no flag %s (its flags: %s)" % (program, flag, " ".join(sorted(known))))
            elif CONFIG_KEY.match(arg) and arg not in config_keys():
                problems.append("%s is not a config key (python train.py --help-config lists them)" % arg)
    return list(dict.fromkeys(problems))


def heading_anchor(title):
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors_of(path):
    text = Path(path).read_text(encoding="utf-8")
    text = FENCE.sub("", text)
    found = set(re.findall(r'<a id="([^"]+)"></a>', text))
    found.update(heading_anchor(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M))
    return found


def link_problems(md_path, text):
    """Relative links of a Markdown text that do not resolve: (line, link, reason)."""
    problems = []
    scanned = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    scanned = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), scanned)
    for match in LINK.finditer(scanned):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
            continue
        line = scanned.count("\n", 0, match.start()) + 1
        file_part, _, anchor = target.partition("#")
        path = (md_path.parent / file_part).resolve() if file_part else md_path
        if not path.exists():
            problems.append((line, target, "%s does not exist" % file_part))
        elif anchor and path.suffix == ".md" and anchor not in anchors_of(str(path)):
            problems.append((line, target, "no anchor #%s in %s" % (anchor, path.name)))
    return problems


def test_every_documented_command_names_what_exists():
    problems = []
    for md in markdown_files():
        for line, command in shell_commands(md.read_text(encoding="utf-8")):
            problems += ["%s:%d: `%s`: %s" % (md.relative_to(ROOT), line, command, p)
                         for p in command_problems(command)]
    assert not problems, "\n".join(problems)


def test_every_relative_link_resolves():
    problems = []
    for md in markdown_files():
        problems += ["%s:%d: (%s): %s" % (md.relative_to(ROOT), line, target, why)
                     for line, target, why in link_problems(md, md.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_readme_stays_within_its_word_budget():
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words <= README_WORD_BUDGET, ("README.md has %d words, over its budget of %d: move detail into the docs "
                                         "page that owns it and link to it" % (words, README_WORD_BUDGET))


def test_the_checks_catch_what_is_broken(tmp_path):
    """Each check fails on a broken case, so the tests above cannot pass vacuously."""
    commands = [command for _, command in shell_commands(
        "```bash\npython train.py --config-file configs/synthetic/acl.yml \\\n    --no-such-flag\n```\n")]
    assert commands == ["python train.py --config-file configs/synthetic/acl.yml --no-such-flag"]
    assert any("train.py has no flag --no-such-flag" in p for p in command_problems(commands[0]))
    assert command_problems("python train.py --config-file configs/synthetic/no_such.yml") == [
        "configs/synthetic/no_such.yml does not exist"]
    assert any("is not a config key" in p for p in command_problems("python test.py SOLVER.NO_SUCH_KEY 1"))
    assert command_problems("make demo no-such-target") == ["make has no target 'no-such-target' (Makefile)"]
    assert command_problems("python tools/no_such_tool.py --x") == ["tools/no_such_tool.py does not exist"]
    assert command_problems("python -m reid.no_such_module") == ["module reid.no_such_module does not exist"]
    assert command_problems("REID_BACKEND=torch python test.py --vis-rank 8 TEST.FLIP True") == []
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [gone](no_such.md) [bad anchor](#no-such-anchor)\n"
                    "<!-- [commented](also_gone.md) -->\n")
    assert [(t, why) for _, t, why in link_problems(page, page.read_text())] == [
        ("no_such.md", "no_such.md does not exist"), ("#no-such-anchor", "no anchor #no-such-anchor in page.md")]
