"""Citations of the method specification resolve, and nothing points outside the repository."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".txt", ".toml", ".ini", ".cfg", ".sh"}


def repo_files():
    skip = {".git", ".venv", ".venv-torch", "output", "datasets", "__pycache__", ".pytest_cache", ".ruff_cache"}
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if path.is_file() and not skip & set(rel.parts) and (path.suffix in SUFFIXES or path.name == "Makefile"):
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
