"""Two HumanEval-format problems: a solution with a blank line and a last line, and one with a nested block."""

import gzip
import json

ADD = {"task_id": "Toy/0", "entry_point": "add", "prompt": 'def add(a, b):\n    """Return a + b."""\n',
       "canonical_solution": "    total = a + b\n\n    return total\n",
       "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"}
LARGEST = {"task_id": "Toy/1", "entry_point": "largest", "prompt": 'def largest(xs):\n    """Largest element."""\n',
           "canonical_solution": "    best = xs[0]\n    for x in xs:\n        if x > best:\n"
                                 "            best = x\n    return best\n",
           "test": "def check(candidate):\n    assert candidate([3, 9, 2]) == 9\n    assert candidate([-5]) == -5\n"}
PROBLEMS = [ADD, LARGEST]


def write_problems(path, problems=PROBLEMS):
    text = "".join(json.dumps(p) + "\n" for p in problems)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path
