"""Never train the drafter on eval prompts or near copies of them
(services/worker/training/decontam.py, scripts/drafter/decontaminate.py)."""
import gzip
import json
from pathlib import Path

import pytest

from dspark.worker.training.decontam import EvalGuard
from dspark.worker.training.selfgen import drop_near_eval

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT.parent / "shared/datasets/eval"
LEAD = "Write a solution to the following problem and make sure that it passes the tests:"
EVALS = ["Write a function to find the nth octagonal number.",
         "Write a python function to find the volume of a triangular prism.",
         f'{LEAD}\n```python\ndef below_threshold(l: list, t: int):\n    """Return True if all numbers are below t."""\n```',
         f'{LEAD}\n```python\ndef truncate_number(number: float) -> float:\n    """..."""\n```',
         f'{LEAD}\n```python\ndef add(x: int, y: int):\n    """Add two numbers."""\n```',
         "Compose an engaging travel blog post about a recent trip to Hawaii."]


def test_equal_rephrased_and_same_entry_point_prompts_are_near():
    g = EvalGuard(EVALS)
    assert g.why(EVALS[0]) == "equal"
    assert g.why("Write a Python function that can find the n-th octagonal number.") == "short task"
    assert g.why("Write a function to find the volume of a triangular prism") == "short task"
    restated = f'Complete the following Python function:\n```python\ndef below_threshold(numbers, t):\n    pass\n```'
    assert g.why(restated) == "entry point"
    # the paraphrases of an earlier round are named, whatever the eval sets hold
    assert EvalGuard([]).why("def running_max(numbers):\n    pass") == "entry point"


def test_honest_neighbours_are_not_near():
    g = EvalGuard(EVALS)
    assert g.why("Write a function to merge two sorted lists into one sorted list.") is None
    assert g.why("Write a python function to reverse the words of a sentence.") is None
    # the instruction line that many eval prompts share is not a task
    other = f'{LEAD}\n```python\ndef transpose(matrix):\n    """Transpose."""\n```'
    assert g.why(other) is None
    # same opening, a different and much longer request
    assert g.why("Compose an engaging travel blog post about a recent trip to Japan, "
                 "highlighting the cultural experiences and must-see attractions.") is None
    assert g.why("Write a haiku about autumn leaves.") is None


def test_gen_drafter_data_skips_near_prompts_and_keeps_ids(tmp_path):
    (tmp_path / "x.jsonl").write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in EVALS[:2]))
    prompts = [("p:0", "Write a Python function that can find the n-th octagonal number."),
               ("p:1", "Write a function to merge two sorted lists."), ("p:2", EVALS[1])]
    kept, near = drop_near_eval(prompts, tmp_path)
    assert near == 2 and kept == [("p:1", "Write a function to merge two sorted lists.")]
    assert drop_near_eval(prompts, tmp_path / "absent") == (prompts, 0)


def test_committed_training_answers_hold_no_eval_prompt_nor_near_copy():
    if not EVAL.is_dir():
        pytest.skip(f"no eval prompt sets at {EVAL}")
    import importlib.util
    spec = importlib.util.spec_from_file_location("decontaminate", ROOT / "scripts/drafter/decontaminate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    guard, index = EvalGuard.from_dir(EVAL), mod.prompt_index()
    n, near, unknown = 0, [], []
    for shard in sorted((ROOT / "data").glob("selfgen*/*/shard-*.jsonl.gz")):
        with gzip.open(shard, "rt", encoding="utf-8") as f:
            for line in f:
                rid = json.loads(line)["id"]
                p = mod.prompt_of(index, rid)
                n += 1
                if p is None:
                    unknown.append(rid)
                elif guard.near(p):
                    near.append(rid)
    assert n > 10000
    assert not unknown[:5] and not near[:5]
