"""The verifier, the step checker, the built-in dataset and the trainer's small token helpers."""

from __future__ import annotations

import os

import pytest
import torch

from grpo_engine.data.builtin_task import (
    HELDOUT_SIZE,
    PRECEDENCE_SHARE,
    builtin_examples,
    check_step,
    solve,
    warmup_examples,
)
from grpo_engine.data.data import load_dataset, read_dataset_file
from grpo_engine.rewards.rewards import extract_final_answer, outcome_reward
from grpo_engine.rollout.tokenization import completion_mask, step_boundaries
from tests.support.files import GSM8K_LIKE, write_hub_style_dataset


def steps_of(text: str) -> list[str]:
    """A completion's steps, cut as a run cuts them (step_boundaries at the default delimiter)."""
    return step_boundaries([text])[0]


# --- the verifier (outcome reward) -----------------------------------------------------------


@pytest.mark.parametrize(
    "completion, answer",
    [
        ("3*4=12\n2+12=14\n#### 14", "14"),
        ("#### 14", "14"),
        ("####14", "14"),
        ("#### 14  \n\n", "14"),  # trailing blank lines and spaces are fine
        ("3*4=12\n2-12=-10\n#### -10", "-10"),  # negative numbers
        ("#### 2.5", "2.5"),
        ("#### 12\n#### 14", "14"),  # the last answer line counts
        ("2+3*4=14", None),  # no "####" line
        ("", None),
        ("#### 14 apples", None),  # junk after the number
        ("#### 14\nso the answer is 14", None),  # junk line after the answer line
        ("#### fourteen", None),
    ],
)
def test_extract_final_answer_reads_the_gsm8k_line(completion, answer):
    assert extract_final_answer(completion)[0] == answer


@pytest.mark.parametrize(
    "completion, reference, reward, formatted",
    [
        ("3*4=12\n2+12=14\n#### 14", "14", 1.0, 1.0),  # right
        ("2+3=5\n5*4=20\n#### 20", "14", 0.0, 1.0),  # wrong
        ("3*4=12\n2+12=14", "14", 0.0, 0.0),  # missing "####"
        ("#### 14 and more", "14", 0.0, 0.0),  # junk after
        ("3*4=12\n2-12=-10\n#### -10", "-10", 1.0, 1.0),  # negative, right
        ("#### 10", "-10", 0.0, 1.0),  # sign matters
        ("#### 14.0", "14", 1.0, 1.0),  # compared as numbers
        ("#### 14", "fourteen", 0.0, 1.0),  # a non-numeric reference is no error
    ],
)
def test_outcome_reward(completion, reference, reward, formatted):
    total, components = outcome_reward(completion, reference)
    assert total == reward
    assert components == {"correct": reward, "formatted": formatted}


# --- the step checker (process reward) -------------------------------------------------------


def test_check_step_accepts_a_right_solution_step_by_step():
    q = "2+3*4"
    assert check_step("3*4=12", q, [])
    assert check_step("2+12=14", q, ["3*4=12"])
    assert check_step("#### 14", q, ["3*4=12", "2+12=14"])
    assert check_step("  3*4=12 ", q, [])  # surrounding spaces are ignored
    assert check_step("2*3=6", "2*3+4", [])  # no precedence issue: left to right is right
    assert check_step("6+4=10", "2*3+4", ["2*3=6"])
    assert check_step("3*4=12", "2-3*4", [])
    assert check_step("2-12=-10", "2-3*4", ["3*4=12"])
    assert check_step("#### -10", "2-3*4", ["3*4=12", "2-12=-10"])


def test_check_step_refuses_wrong_arithmetic():
    assert not check_step("3*4=13", "2+3*4", [])
    assert not check_step("2+12=15", "2+3*4", ["3*4=12"])
    assert not check_step("#### 15", "2+3*4", ["3*4=12", "2+12=14"])


def test_check_step_refuses_steps_that_violate_precedence():
    q = "2+3*4"
    assert not check_step("2+3=5", q, [])  # right arithmetic, wrong order
    assert not check_step("5*4=20", q, ["2+3=5"])
    assert not check_step("#### 20", q, ["2+3=5", "5*4=20"])


def test_check_step_refuses_out_of_place_steps():
    q = "2+3*4"
    assert not check_step("#### 14", q, ["3*4=12"])  # the answer line too early
    assert not check_step("#### 14", q, ["3*4=12", "2+12=14", "#### 14"])  # a step after the answer
    assert not check_step("3*4=12", "2+3*4+5", [])  # not a built-in question


def test_check_step_final_line_states_the_answer_as_a_plain_number():
    q = "2+3*4"
    right = ["3*4=12", "2+12=14"]
    for line in ("#### 14", "####14", "#### 14  ", "#### 14.0", "#### 014"):
        assert check_step(line, q, right), line
    for line in (
        "#### 15",
        "#### 14.5",
        "#### 14 apples",
        "#### fourteen",
        "14",
        "\\boxed{14}",
        "#### ",
        "#### 2+12",
        "#### 28/2",
        "#### x=14",
    ):
        assert not check_step(line, q, right), line
    assert check_step("#### -10", "2-3*4", ["3*4=12", "2-12=-10"])


def test_check_step_verdicts_on_every_builtin_example_and_its_wrong_variants():
    """Every step of every reference solution is right; a left-to-right solution is wrong from its first
    step wherever that differs; a wrong, missing or misplaced answer line is wrong; and on a ``####`` line
    the last step's verdict is the verifier's (outcome "correct") on the whole solution."""
    train, heldout = builtin_examples()
    for e in train + heldout:
        q, answer = e["question"], int(e["answer"])
        a, op1, b, op2, c = int(q[0]), q[1], int(q[2]), q[3], int(q[4])
        right, _ = solve(a, op1, b, op2, c)
        good = {f"#### {answer}", f"####{answer}", f"#### {answer}.0"}
        wrong = (f"#### {answer + 1}", f"#### {-answer}", f"#### {answer} apples", f"\\boxed{{{answer}}}", str(answer))
        for final in (*good, *wrong):
            steps = [*right, final]
            assert [check_step(s, q, steps[:j]) for j, s in enumerate(steps)] == [True, True, final in good], (q, final)
            if final.startswith("####"):
                assert outcome_reward("\n".join(steps), e["answer"])[1]["correct"] == float(final in good), (q, final)
        slip, slip_answer = solve(a, op1, b, op2, c, respect_precedence=False)
        steps = [*slip, f"#### {slip_answer}"]
        same = slip == right  # left to right is right when the first operator binds at least as tightly
        assert [check_step(s, q, steps[:j]) for j, s in enumerate(steps)] == [same, same, slip_answer == answer], q
        assert not check_step(f"#### {answer}", q, right[:1])  # the answer line too early
        assert not check_step(f"#### {answer}", q, [*right, f"#### {answer}"])  # a step after the answer


# --- the built-in dataset --------------------------------------------------------------------


def _is_precedence_shape(q: str) -> bool:
    return q[1] in "+-" and q[3] == "*"


def test_builtin_heldout_split_is_fixed_and_disjoint():
    train, heldout = builtin_examples()
    train2, heldout2 = builtin_examples()
    assert heldout == heldout2 and train == train2
    assert load_dataset("builtin-arith") == (train, heldout)
    assert len(heldout) == HELDOUT_SIZE
    train_q = [e["question"] for e in train]
    held_q = [e["question"] for e in heldout]
    assert len(set(train_q)) == len(train_q) and len(set(held_q)) == len(held_q)
    assert not set(train_q) & set(held_q)


def test_builtin_answers_equal_python_eval_and_solutions_check_out():
    train, heldout = builtin_examples()
    for e in train + heldout:
        q = e["question"]
        assert e["answer"] == str(eval(q)), q
        steps = steps_of(e["solution"])
        assert steps[-1] == f"#### {e['answer']}"
        assert [check_step(s, q, steps[:j]) for j, s in enumerate(steps)] == [True] * len(steps), e


def test_builtin_precedence_share():
    train, heldout = builtin_examples()
    questions = [e["question"] for e in train + heldout]
    share = sum(map(_is_precedence_shape, questions)) / len(questions)
    assert share == pytest.approx(PRECEDENCE_SHARE, abs=1 / len(questions))
    held_share = sum(_is_precedence_shape(e["question"]) for e in heldout) / len(heldout)
    assert held_share == pytest.approx(PRECEDENCE_SHARE, abs=0.1)
    # in those shapes working left to right gives a wrong answer, except when the last operand is 1
    for q in questions:
        if _is_precedence_shape(q) and q[4] != "1":
            a, op1, b, op2, c = int(q[0]), q[1], int(q[2]), q[3], int(q[4])
            assert solve(a, op1, b, op2, c, respect_precedence=False)[1] != eval(q), q


def test_warmup_examples_are_deterministic_and_from_the_training_split():
    first = warmup_examples(300, wrong_share=0.7, seed=3)
    assert first == warmup_examples(300, wrong_share=0.7, seed=3)
    assert first != warmup_examples(300, wrong_share=0.7, seed=4)
    train, heldout = builtin_examples()
    held_q = {e["question"] for e in heldout}
    train_q = {e["question"] for e in train}
    for e in first:
        if len(e["question"]) == 5:  # a full question (the others are one-step drills like "16+4")
            assert e["question"] in train_q and e["question"] not in held_q


def test_warmup_examples_contain_left_to_right_solutions_at_the_configured_share():
    wrong_share, drill_share, n = 0.7, 0.4, 3000
    examples = warmup_examples(n, wrong_share=wrong_share, seed=0, drill_share=drill_share)
    drills = [e for e in examples if len(e["question"]) != 5]
    full = [e for e in examples if len(e["question"]) == 5]
    assert len(drills) / n == pytest.approx(drill_share, abs=0.04)
    for e in drills:  # drills are always right
        assert e["answer"] == str(eval(e["question"]))
    left_to_right = wrong_answers = 0
    precedence = [e for e in full if _is_precedence_shape(e["question"])]
    for e in full:
        q = e["question"]
        first_step = steps_of(e["solution"])[0]
        is_l2r = first_step.startswith(q[:3] + "=") and _is_precedence_shape(q)
        left_to_right += is_l2r
        if e["answer"] != str(eval(q)):
            wrong_answers += 1
            assert is_l2r, e  # every wrong answer comes from working left to right
        assert e["solution"].endswith(f"#### {e['answer']}")
    assert left_to_right / len(precedence) == pytest.approx(wrong_share, abs=0.05)
    assert wrong_answers > 0.5 * left_to_right  # most left-to-right solutions end wrong


def test_warmup_examples_without_wrong_share_are_all_right():
    for e in warmup_examples(300, wrong_share=0.0, seed=1):
        assert e["answer"] == str(eval(e["question"]))


# --- dataset files (read_dataset_file, and load_dataset on them) -----------------------------

ROWS = [
    {"question": "1+2*3", "answer": "7", "solution": "2*3=6\n1+6=7\n#### 7"},
    {"question": "2*3-1", "answer": "5", "solution": ""},
    {"question": "4-1+2", "answer": "5", "solution": "4-1=3\n3+2=5\n#### 5"},
]


def _write(path, text: str | bytes):
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_csv_and_parquet_files_read_the_same_rows(tmp_path):
    import json

    import pandas as pd

    jsonl = _write(tmp_path / "d.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS) + "\n")  # blank line skipped
    frame = pd.DataFrame(ROWS)
    frame.to_csv(tmp_path / "d.csv", index=False)  # the solutions' newlines are quoted fields over lines
    frame.to_parquet(tmp_path / "d.parquet")
    for path in (jsonl, tmp_path / "d.csv", tmp_path / "d.parquet", tmp_path / "D.JSONL"):
        if not path.exists():
            path.write_bytes(jsonl.read_bytes())  # the extension's case does not matter
        assert read_dataset_file(path) == ROWS, path


def test_numbers_are_answers_solution_is_optional_and_a_bom_is_fine(tmp_path):
    path = _write(tmp_path / "d.jsonl", '\ufeff{"question": "1+1", "answer": 2}\n{"question": 3.5, "answer": "4"}\n')
    assert read_dataset_file(path) == [
        {"question": "1+1", "answer": "2", "solution": ""},
        {"question": "3.5", "answer": "4", "solution": ""},
    ]
    csv = _write(tmp_path / "d.csv", "answer , question\n2,1+1\n,\n4,2+2\n")  # spaces in the header; a line of empties
    assert [r["answer"] for r in read_dataset_file(csv)] == ["2", "4"]


def test_load_dataset_holds_out_the_last_tenth_of_a_csv_or_parquet_file(tmp_path):
    import pandas as pd

    rows = [{"question": f"{i}+1", "answer": str(i + 1), "solution": ""} for i in range(30)]
    pd.DataFrame(rows).to_parquet(tmp_path / "d.parquet")
    pd.DataFrame(rows).to_csv(tmp_path / "d.csv", index=False)
    for name in ("d.parquet", "d.csv"):
        train, heldout = load_dataset(str(tmp_path / name))
        assert train == rows[:27] and heldout == rows[27:]
    with pytest.raises(ValueError, match="dataset '.*missing.csv': no such file"):
        load_dataset(str(tmp_path / "missing.csv"))


def test_a_hugging_face_dataset_with_config_split_and_eval_split(tmp_path):
    root = write_hub_style_dataset(tmp_path / "gsm8k")
    train, heldout = load_dataset(str(root), config="main", split="train", eval_split="test")
    assert [r["question"] for r in train] == [r["question"] for r in GSM8K_LIKE[:10]]
    assert [r["question"] for r in heldout] == [r["question"] for r in GSM8K_LIKE[10:]]
    assert train[3]["answer"] == GSM8K_LIKE[3]["answer"]  # the whole solution; the verifier reads its '#### 8'
    assert outcome_reward("3+5=8\n#### 8", train[3]["answer"])[0] == 1.0
    train, heldout = load_dataset(str(root), config="main")  # no eval split: the last tenth of train
    assert len(train) == 9 and len(heldout) == 1
    with pytest.raises(ValueError, match=r"split 'validation'\) could not be loaded"):
        load_dataset(str(root), config="main", split="validation")
    with pytest.raises(ValueError, match="no column 'problem'.*set question_field"):
        load_dataset(str(root), config="main", fields=("problem", "answer", "solution"))


def test_field_mapping_reads_other_column_names(tmp_path):
    import pandas as pd

    rows = [{"problem": f"{i}*2", "final": str(2 * i), "steps": f"{i}*2={2 * i}"} for i in range(1, 11)]
    pd.DataFrame(rows).to_csv(tmp_path / "m.csv", index=False)
    train, heldout = load_dataset(str(tmp_path / "m.csv"), fields=("problem", "final", "steps"))
    assert train[0] == {"question": "1*2", "answer": "2", "solution": "1*2=2"} and len(heldout) == 1
    with pytest.raises(ValueError, match="needs the columns 'question' and 'answer'"):
        load_dataset(str(tmp_path / "m.csv"))


def test_an_unreachable_hub_dataset_fails_with_a_message_saying_so():
    import subprocess
    import sys

    code = (
        "from grpo_engine.data.data import load_dataset\n"
        "try:\n    load_dataset('nobody/no-such-dataset')\nexcept ValueError as e:\n    print(e)\n"
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }  # no hub here: fail at once, not after retries
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("dataset 'nobody/no-such-dataset' (config 'default', split 'train') could not be loaded: "), (
        out
    )


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("a.jsonl", '{"question": "1", "answer": "1"}\n{"question": \n', "line 2 is not valid JSON (Expecting value)"),
        ("a.jsonl", '{"question": "1", "answer": "1"}\n\n"text"\n', "line 3 is not a JSON object (it is a str)"),
        ("a.jsonl", '{"question": "1"}\n', "line 1 needs the fields 'question' and 'answer'"),
        (
            "a.jsonl",
            '{"question": "1", "answer": "1"}\n{"question": "", "answer": "1"}\n',
            "line 2 has an empty 'question'",
        ),
        ("a.jsonl", '{"question": "1", "answer": null}\n', "line 1 has an empty 'answer'"),
        ("a.jsonl", '{"question": "1", "answer": true}\n', "line 1: 'answer' must be text or a number, got bool"),
        ("a.jsonl", '{"question": {"a": 1}, "answer": "1"}\n', "line 1: 'question' must be text or a number, got dict"),
        (
            "a.jsonl",
            '{"question": "1", "answer": "1"}\n' + "[" * 100_000 + "\n",
            "line 2 is not valid JSON (maximum recursion",
        ),
        ("a.jsonl", '{"question": "1", "answer": ' + "9" * 5000 + "}\n", "line 1 is not valid JSON (Exceeds the limit"),
        ("a.jsonl", '{"question": "1", "answer": "1"}\n', "needs at least 2 rows, found 1"),
        ("a.jsonl", "", "the file is empty"),
        ("a.jsonl", " \n\n", "the file is empty"),
        ("a.jsonl", b'{"question": "1", "answer": "1"}\n\xff\xfe\x00', "line 2 is not UTF-8 text (a binary file?)"),
        ("a.jsonl", '{"question": "1", "answer": "1"}\n\n\x00\x01', "line 3 holds a NUL byte: a binary file"),
        ("a.csv", 'question,answer\n1,1\n"2\nstill 2",\n', "line 4 has an empty 'answer'"),  # line of the row's end
        ("a.csv", "question,answer\n1,1\n2,2,2\n", "line 3 has 3 fields, the header has 2"),
        (
            "a.csv",
            "q,a\n1,1\n",
            "needs the columns 'question' and 'answer'; missing 'question', 'answer' (found: 'q', 'a')",
        ),
        ("a.csv", 'question,answer\n1,"1\n', "line 2 is not valid CSV (unexpected end of data)"),
        ("a.parquet", "PAR1 not really", "not a valid Parquet file"),
        ("a.txt", "question,answer\n", "unsupported file type '.txt'; a dataset file is .jsonl, .csv, .parquet"),
        ("a", "question,answer\n", "unsupported file type '(no extension)'"),
    ],
)
def test_a_bad_file_is_refused_naming_it_and_the_line(tmp_path, name, content, message):
    path = _write(tmp_path / name, content)
    with pytest.raises(ValueError) as caught:
        read_dataset_file(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    with pytest.raises(ValueError, match="^mine: "):  # the name messages use, when the path is not the user's
        read_dataset_file(path, name="mine")


def test_a_missing_file_or_a_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="missing.csv: no such file"):
        read_dataset_file(tmp_path / "missing.csv")
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(ValueError, match="dir.jsonl: cannot read it"):
        read_dataset_file(tmp_path / "dir.jsonl")


def test_parquet_rows_are_counted_from_1_and_nulls_are_empty(tmp_path):
    import pandas as pd

    pd.DataFrame({"question": ["1", "2", "3"], "answer": ["1", "2", None]}).to_parquet(tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="d.parquet: row 3 has an empty 'answer'"):
        read_dataset_file(tmp_path / "d.parquet")
    pd.DataFrame({"question": ["1", "2"]}).to_parquet(tmp_path / "q.parquet")
    with pytest.raises(ValueError, match="missing 'answer' \\(found: 'question'\\)"):
        read_dataset_file(tmp_path / "q.parquet")


# --- the trainer's token helpers -------------------------------------------------------------


def test_step_boundaries_one_character_per_token():
    # "3*4=12" is chars 0..5, "\n" 6, "2+12=14" 7..13, "\n" 14, "#### 14" 15..21
    steps, ends = step_boundaries(list("3*4=12\n2+12=14\n#### 14"))
    assert steps == ["3*4=12", "2+12=14", "#### 14"]
    assert ends == [5, 13, 21]


def test_step_boundaries_multi_character_tokens():
    # tokens: 0 "3*4", 1 "=12\n2", 2 "+12=14\n", 3 "####", 4 " 14"
    # step 1 ends with "2" of "12" in token 1; step 2 ends with "4" in token 2; step 3 in token 4
    steps, ends = step_boundaries(["3*4", "=12\n2", "+12=14\n", "####", " 14"])
    assert steps == ["3*4=12", "2+12=14", "#### 14"]
    assert ends == [1, 2, 4]


def test_step_boundaries_skip_blank_lines_and_trailing_spaces():
    # chars: 0-1 "\n\n", 2..7 "3*4=12", 8-9 spaces, 10-11 "\n\n", 12..18 "#### 14", 19 "\n"
    steps, ends = step_boundaries(list("\n\n3*4=12  \n\n#### 14\n"))
    assert steps == ["3*4=12", "#### 14"]
    assert ends == [7, 18]
    assert step_boundaries([]) == ([], [])


def test_completion_mask():
    eos = 1
    completions = torch.tensor(
        [
            [5, 6, 1, 0, 0],  # EOS at 2: tokens 0..2 are real
            [5, 1, 1, 0, 0],  # only the first EOS counts
            [5, 6, 7, 8, 9],  # no EOS: truncated, all real
            [1, 0, 0, 0, 0],  # EOS first
        ]
    )
    mask, ended = completion_mask(completions, eos)
    assert mask.tolist() == [
        [1.0, 1.0, 1.0, 0.0, 0.0],
        [1.0, 1.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 1.0, 1.0],
        [1.0, 0.0, 0.0, 0.0, 0.0],
    ]
    assert ended.tolist() == [True, True, False, True]
