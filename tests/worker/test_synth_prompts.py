"""scripts/drafter/synth_prompts.py: the new drafter-training prompts are
seeded (the same files on every machine), of the promised kinds and sizes,
and share nothing with the eval sets (never train on eval prompts)."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT.parent / "shared/datasets/eval"


def _load():
    spec = importlib.util.spec_from_file_location(
        "synth_prompts", ROOT / "scripts/drafter/synth_prompts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read(path: Path) -> list[str]:
    return [json.loads(line)["turns"][0] for line in path.read_text(encoding="utf-8").split("\n")
            if line.strip()]


def test_synth_prompts_are_seeded_and_match_the_committed_files(tmp_path, monkeypatch):
    mod = _load()
    monkeypatch.setattr("sys.argv", ["synth_prompts.py", str(tmp_path)])
    assert mod.main() == 0
    sizes = {p.stem: len(_read(p)) for p in tmp_path.glob("*.jsonl")}
    assert sizes["synth-chat"] == 1400 and sizes["synth-math"] == 250
    assert sizes["synth-pyfunc"] >= 400 and sizes["synth-stubs"] >= 300
    # chat and function tasks are drawn before the stdlib stubs (whose count
    # depends on the Python version), so they must equal the committed files
    committed = ROOT / "data/prompts-synth"
    for name in ("synth-chat", "synth-pyfunc"):
        assert _read(tmp_path / f"{name}.jsonl") == _read(committed / f"{name}.jsonl")
    again = tmp_path / "again"
    monkeypatch.setattr("sys.argv", ["synth_prompts.py", str(again), "1"])
    mod.main()
    assert _read(again / "synth-chat.jsonl") != _read(tmp_path / "synth-chat.jsonl")


def test_synth_prompts_share_nothing_with_the_eval_sets():
    if not EVAL.is_dir():
        pytest.skip(f"no eval prompt sets at {EVAL}")
    evals = [t for f in EVAL.glob("*.jsonl") for t in _read(f)]
    synth = [t for f in (ROOT / "data/prompts-synth").glob("*.jsonl") for t in _read(f)]
    assert len(synth) > 2000
    eval_set = set(evals)
    assert not [s for s in synth if s in eval_set]
    # no line of an eval problem inside a synthetic prompt (the stubs quote stdlib
    # docstrings): every eval line of 40+ characters but the shared instructions
    from collections import Counter
    lines = Counter(ln.strip() for e in evals for ln in set(e.split("\n")))
    problem = {ln for ln, n in lines.items() if len(ln) >= 40 and n <= 3}
    assert len(problem) > 1000
    synth_lines = {ln.strip() for s in synth for ln in s.split("\n")}
    assert not sorted(problem & synth_lines)[:5]
